//! What follows an attempt of a plain step: a retry after a delay, the next
//! `loop_until` iteration, or done. Pure: `runner::step` performs it.

use std::time::Duration;

use super::flow::retry_delay;
use crate::pipeline::{LoopUntil, Retry};

/// What follows a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AfterFailure {
    /// Try again after `delay`, as attempt number `attempt`.
    Retry { attempt: u32, delay: Duration },
    /// The step fails with this attempt's error.
    Fail,
}

/// After try number `try_no` (1-based, within this iteration) failed as
/// attempt number `attempt`. An error that is not `retriable` (a configuration
/// error) fails the step at once, whatever `retry` allows.
pub fn after_failure(
    retry: Option<&Retry>,
    try_no: u32,
    attempt: u32,
    retriable: bool,
) -> AfterFailure {
    match retry {
        Some(r) if retriable && try_no < r.attempts => AfterFailure::Retry {
            attempt: attempt + 1,
            delay: retry_delay(r, try_no),
        },
        _ => AfterFailure::Fail,
    }
}

/// What follows an attempt that produced an output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterOutput {
    /// `loop_until` was not reached and iterations remain.
    NextIteration,
    Done,
}

/// After iteration number `iteration` (1-based) produced `confidence`.
pub fn after_output(
    loop_until: Option<&LoopUntil>,
    iteration: u32,
    confidence: f64,
) -> AfterOutput {
    match loop_until {
        Some(l) if confidence < l.confidence && iteration < l.max_iterations => {
            AfterOutput::NextIteration
        }
        _ => AfterOutput::Done,
    }
}

/// How a loop that may iterate ended, for the run log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopEnd {
    Converged,
    Exhausted,
}

/// How a loop ended with `confidence`; none for a step that cannot iterate
/// (no `loop_until`, or `max_iterations: 1`).
pub fn loop_end(loop_until: Option<&LoopUntil>, confidence: f64) -> Option<LoopEnd> {
    let l = loop_until.filter(|l| l.max_iterations > 1)?;
    Some(if confidence >= l.confidence {
        LoopEnd::Converged
    } else {
        LoopEnd::Exhausted
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Backoff;

    fn retry(attempts: u32, backoff: Backoff) -> Option<Retry> {
        Some(Retry {
            attempts,
            backoff,
            delay_seconds: 0.5,
        })
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// (retry, try_no, attempt, retriable) -> expected.
    fn check(input: (Option<Retry>, u32, u32, bool), expected: AfterFailure) {
        let (r, try_no, attempt, retriable) = input;
        assert_eq!(
            after_failure(r.as_ref(), try_no, attempt, retriable),
            expected,
            "{r:?} try {try_no} attempt {attempt} retriable {retriable}"
        );
    }

    #[test]
    fn retry_branches() {
        use AfterFailure::*;
        use Backoff::*;
        check((None, 1, 1, true), Fail);
        check((retry(1, Fixed), 1, 1, true), Fail);
        check(
            (retry(3, Fixed), 1, 1, true),
            Retry {
                attempt: 2,
                delay: secs(0.5),
            },
        );
        check(
            (retry(3, Fixed), 2, 2, true),
            Retry {
                attempt: 3,
                delay: secs(0.5),
            },
        );
        check((retry(3, Fixed), 3, 3, true), Fail);
        check(
            (retry(4, Exponential), 3, 3, true),
            Retry {
                attempt: 4,
                delay: secs(2.0),
            },
        );
        // Attempts count on across loop iterations; tries restart per iteration.
        check(
            (retry(2, Fixed), 1, 5, true),
            Retry {
                attempt: 6,
                delay: secs(0.5),
            },
        );
        // A configuration error is not retried.
        check((retry(3, Fixed), 1, 1, false), Fail);
        check((None, 1, 1, false), Fail);
    }

    #[test]
    fn loop_branches() {
        use AfterOutput::*;
        let l = |confidence, max_iterations| LoopUntil {
            confidence,
            max_iterations,
        };
        let cases = [
            // loop_until, iteration, confidence -> after, end
            (None, 1, 0.1, Done, None),
            (Some(l(0.8, 1)), 1, 0.1, Done, None),
            (
                Some(l(0.8, 3)),
                1,
                0.1,
                NextIteration,
                Some(LoopEnd::Exhausted),
            ),
            (Some(l(0.8, 3)), 2, 0.8, Done, Some(LoopEnd::Converged)),
            (Some(l(0.8, 3)), 3, 0.5, Done, Some(LoopEnd::Exhausted)),
            (Some(l(0.8, 3)), 1, 0.95, Done, Some(LoopEnd::Converged)),
        ];
        for (lu, iteration, confidence, after, end) in cases {
            assert_eq!(
                after_output(lu.as_ref(), iteration, confidence),
                after,
                "{lu:?} {iteration} {confidence}"
            );
            assert_eq!(
                loop_end(lu.as_ref(), confidence),
                end,
                "{lu:?} {confidence}"
            );
        }
    }
}
