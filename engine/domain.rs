//! The words of the run model: statuses, kinds, channels, ids and timestamps.
//!
//! This is the bottom floor: it imports nothing from the crate, and every other
//! module names a status through these types instead of writing the word. Each enum
//! lists its words once, in the table its `words!` invocation declares; `as_str` and
//! `parse` are generated from that table, so the word a run is stored under and the
//! word the API shows can never drift apart. The store keeps them as TEXT (the schema
//! did not change) and reports a word it does not know as a corrupt row.

use std::fmt;

/// Unix time in milliseconds, the unit of every timestamp the store keeps.
pub type UnixMillis = i64;

/// A run's id (a UUID in its text form). The store and the API carry it as a string;
/// this alias names what the string is.
pub type RunId = String;

/// A closed set of words with one text form each.
pub trait Word: Copy + Sized + 'static {
    /// What the words name, for error messages ("run status").
    const WHAT: &'static str;
    /// Every value, in table order.
    const ALL: &'static [Self];
    fn as_str(self) -> &'static str;
    fn parse(word: &str) -> Option<Self>;
}

/// The error for a word that is not in a type's table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{word}` is not a {what} (expected one of: {expected})")]
pub struct UnknownWord {
    pub what: &'static str,
    pub word: String,
    pub expected: String,
}

/// Parses `word` as a `T`, or says which words would have been accepted.
pub fn parse_word<T: Word>(word: &str) -> Result<T, UnknownWord> {
    T::parse(word).ok_or_else(|| UnknownWord {
        what: T::WHAT,
        word: word.to_string(),
        expected: T::ALL
            .iter()
            .map(|w| w.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Declares a word enum: the variants with their words (the one table), `as_str`,
/// `parse`, `Display`, comparison with `&str` (so `status == "running"` still reads
/// naturally in tests) and serialisation as the word.
macro_rules! words {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident = $word:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl Word for $name {
            const WHAT: &'static str = $what;
            const ALL: &'static [Self] = &[$($name::$variant,)+];
            fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)+
                }
            }
            fn parse(word: &str) -> Option<Self> {
                match word {
                    $($word => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl $name {
            /// The word, as stored and shown.
            pub fn as_str(self) -> &'static str {
                <Self as Word>::as_str(self)
            }

            /// The value for `word`, or `None` for a word not in the table.
            pub fn parse(word: &str) -> Option<Self> {
                <Self as Word>::parse(word)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownWord;
            fn from_str(s: &str) -> Result<Self, UnknownWord> {
                parse_word(s)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl From<$name> for serde_json::Value {
            fn from(w: $name) -> serde_json::Value {
                serde_json::Value::from(w.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

words! {
    /// A run's status. `running` is the only status that is not terminal.
    RunStatus, "run status" {
        Running = "running",
        Completed = "completed",
        Stopped = "stopped",
        Escalated = "escalated",
        Aborted = "aborted",
        Failed = "failed",
        Interrupted = "interrupted",
        Cancelled = "cancelled",
    }
}

impl RunStatus {
    /// Whether a run that ended this way ended well (its exit code is 0, its
    /// `run_finished` is logged at info).
    pub fn is_success(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Stopped)
    }
}

words! {
    /// The status of a step record, and the status a unit (step, group, fan-out)
    /// settles with. `running` is recorded before the executor is called; `waiting`
    /// is a human step whose approval is pending.
    StepStatus, "step status" {
        Running = "running",
        Completed = "completed",
        Stopped = "stopped",
        Escalated = "escalated",
        Aborted = "aborted",
        Failed = "failed",
        Skipped = "skipped",
        Waiting = "waiting",
    }
}

impl StepStatus {
    /// The run status of a run that ends because a unit ended this way: the same
    /// word for `stopped`, `escalated`, `aborted` and `failed`. A unit that settles
    /// as `completed` or `skipped` ends a run only as its last step; `running` and
    /// `waiting` never settle a unit and end nothing, so they map to `failed`.
    pub fn run_ending(self) -> RunStatus {
        match self {
            StepStatus::Completed | StepStatus::Skipped => RunStatus::Completed,
            StepStatus::Stopped => RunStatus::Stopped,
            StepStatus::Escalated => RunStatus::Escalated,
            StepStatus::Aborted => RunStatus::Aborted,
            StepStatus::Failed | StepStatus::Running | StepStatus::Waiting => RunStatus::Failed,
        }
    }
}

words! {
    /// What a step record stands for.
    StepKind, "step kind" {
        Step = "step",
        Parallel = "parallel",
        Branch = "branch",
        FanOut = "fan_out",
        FanOutBranch = "fan_out_branch",
    }
}

impl StepKind {
    /// A branch of a parallel group or of a fan-out.
    pub fn is_branch(self) -> bool {
        matches!(self, StepKind::Branch | StepKind::FanOutBranch)
    }
}

words! {
    /// An approval request's status. The first decision wins; `closed` is a request
    /// whose run ended while it was pending.
    ApprovalStatus, "approval status" {
        Pending = "pending",
        Approved = "approved",
        Rejected = "rejected",
        Timeout = "timeout",
        Closed = "closed",
    }
}

words! {
    /// A recorded notification's status.
    NotificationStatus, "notification status" {
        Pending = "pending",
        Sent = "sent",
        Failed = "failed",
    }
}

words! {
    /// Where a notification or an approval request goes. `page` is the approvals
    /// page alone (nothing is sent).
    Channel, "notification channel" {
        Log = "log",
        Webhook = "webhook",
        Telegram = "telegram",
        Page = "page",
    }
}

words! {
    /// The level of a run-log event.
    Level, "log level" {
        Info = "info",
        Warn = "warn",
        Error = "error",
    }
}

words! {
    /// The result label of `vectorstep_notifications_total`.
    SendResult, "notification result" {
        Sent = "sent",
        Failed = "failed",
    }
}

words! {
    /// An agent turn's status in the step journal: `started` is recorded before the
    /// model is called, `completed` with its reply and usage before any tool of that
    /// reply runs. A completed turn is never requested again.
    TurnStatus, "turn status" {
        Started = "started",
        Completed = "completed",
        Failed = "failed",
    }
}

words! {
    /// A tool call's status in the step journal. `waiting` is parked for a human;
    /// `rejected` and `timed_out` are decisions returned to the model as the tool's
    /// result; `escalated` is a write call in flight at a crash under
    /// `on_interrupted: escalate`.
    ToolCallStatus, "tool call status" {
        Started = "started",
        Completed = "completed",
        Failed = "failed",
        Waiting = "waiting",
        Rejected = "rejected",
        TimedOut = "timed_out",
        Escalated = "escalated",
    }
}

impl ToolCallStatus {
    /// Whether the call has its result for the model (it is never run again).
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            ToolCallStatus::Completed
                | ToolCallStatus::Failed
                | ToolCallStatus::Rejected
                | ToolCallStatus::TimedOut
        )
    }
}

words! {
    /// A tool's effect class: `read` calls may be repeated freely, `write` calls in
    /// flight at a crash follow the pipeline's `durable.on_interrupted`.
    ToolEffect, "tool effect" {
        Read = "read",
        Write = "write",
    }
}

words! {
    /// A delegation's status: a completed one is reused after a crash, a failed one
    /// is not cached and runs again.
    DelegationStatus, "delegation status" {
        Started = "started",
        Completed = "completed",
        Failed = "failed",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn round_trips<T: Word + PartialEq + fmt::Debug>() {
        for &w in T::ALL {
            assert_eq!(T::parse(w.as_str()), Some(w), "{}", T::WHAT);
        }
        let words: std::collections::HashSet<_> = T::ALL.iter().map(|w| w.as_str()).collect();
        assert_eq!(
            words.len(),
            T::ALL.len(),
            "{}: a word is listed twice",
            T::WHAT
        );
    }

    #[test]
    fn every_word_round_trips() {
        round_trips::<RunStatus>();
        round_trips::<StepStatus>();
        round_trips::<StepKind>();
        round_trips::<ApprovalStatus>();
        round_trips::<NotificationStatus>();
        round_trips::<Channel>();
        round_trips::<SendResult>();
        round_trips::<Level>();
        round_trips::<TurnStatus>();
        round_trips::<ToolCallStatus>();
        round_trips::<ToolEffect>();
        round_trips::<DelegationStatus>();
    }

    #[test]
    fn an_unknown_word_says_what_was_expected() {
        let e = parse_word::<RunStatus>("done").unwrap_err();
        assert_eq!(
            e.to_string(),
            "`done` is not a run status (expected one of: running, completed, stopped, \
             escalated, aborted, failed, interrupted, cancelled)"
        );
    }

    /// Every `.rs` file under `engine/<dir>`, with its text up to its test module.
    pub(crate) fn sources(dir: &str) -> Vec<(String, String)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).expect("a source folder").flatten() {
                let path = entry.path();
                if path.is_dir() && path.file_name().is_some_and(|n| n != "tests") {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("engine");
        let mut files = Vec::new();
        walk(&root.join(dir), &mut files);
        files
            .into_iter()
            .map(|f| {
                let text = std::fs::read_to_string(&f).expect("a readable source file");
                let code = match text.find("#[cfg(test)]") {
                    Some(i) => text[..i].to_string(),
                    None => text,
                };
                let name = f.strip_prefix(&root).unwrap_or(&f).display().to_string();
                (name, code)
            })
            .collect()
    }

    /// The engine names statuses through these types only (the same check as
    /// `grep -rn '"running"' engine/`, for every word of every status). SQL in
    /// `store/` quotes its words with `'`, so the schema's own lists are not caught.
    #[test]
    fn no_status_word_literal_outside_this_file() {
        let mut words: Vec<&str> = Vec::new();
        words.extend(RunStatus::ALL.iter().map(|w| w.as_str()));
        words.extend(StepStatus::ALL.iter().map(|w| w.as_str()));
        words.extend(ApprovalStatus::ALL.iter().map(|w| w.as_str()));
        words.extend(NotificationStatus::ALL.iter().map(|w| w.as_str()));
        let mut found = Vec::new();
        for (file, code) in sources("") {
            if file == "domain.rs" {
                continue;
            }
            for w in &words {
                if code.contains(&format!("\"{w}\"")) {
                    found.push(format!("{file}: \"{w}\""));
                }
            }
        }
        assert!(
            found.is_empty(),
            "status words written as literals; use the types of engine/domain.rs: {found:#?}"
        );
    }

    /// The words are the ones the schema's CHECK constraints allow, in the order
    /// `store/migrations.rs` lists them.
    #[test]
    fn the_words_match_the_schema() {
        let schema = sources("store")
            .into_iter()
            .find(|(f, _)| f.ends_with("migrations.rs"))
            .map(|(_, code)| code)
            .expect("store/migrations.rs");
        // Each `<column> IN ('a', 'b', ...)` list, in the order of the schema.
        let lists: Vec<Vec<String>> = schema
            .split(" IN (")
            .skip(1)
            .map(|rest| {
                rest.split(')')
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(|w| w.trim().trim_matches('\'').to_string())
                    .collect()
            })
            .collect();
        let table = |all: Vec<&'static str>| all.into_iter().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            lists.first(),
            Some(&table(RunStatus::ALL.iter().map(|s| s.as_str()).collect()))
        );
        assert_eq!(
            lists.get(1),
            Some(&table(StepKind::ALL.iter().map(|s| s.as_str()).collect()))
        );
        assert_eq!(
            lists.get(2),
            Some(&table(StepStatus::ALL.iter().map(|s| s.as_str()).collect()))
        );
        assert_eq!(
            lists.get(3),
            Some(&table(
                ApprovalStatus::ALL.iter().map(|s| s.as_str()).collect()
            ))
        );
        assert_eq!(
            lists.get(4),
            Some(&table(
                NotificationStatus::ALL.iter().map(|s| s.as_str()).collect()
            ))
        );
    }

    /// The step journal's words are the ones its tables' CHECK constraints allow:
    /// the lists after the first five, in the order of migration 0006.
    #[test]
    fn the_journal_words_match_the_schema() {
        let schema = sources("store")
            .into_iter()
            .find(|(f, _)| f.ends_with("migrations.rs"))
            .map(|(_, code)| code)
            .expect("store/migrations.rs");
        let lists: Vec<String> = schema
            .split(" IN (")
            .skip(1)
            .map(|rest| {
                rest.split(')')
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(|w| w.trim().trim_matches('\'').to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        fn of<T: Word>() -> String {
            T::ALL
                .iter()
                .map(|w| w.as_str())
                .collect::<Vec<_>>()
                .join(",")
        }
        assert_eq!(
            lists.get(5..9),
            Some(
                &[
                    of::<TurnStatus>(),
                    of::<ToolEffect>(),
                    of::<ToolCallStatus>(),
                    of::<DelegationStatus>(),
                ][..]
            )
        );
        assert_eq!(
            of::<ToolCallStatus>(),
            "started,completed,failed,waiting,rejected,timed_out,escalated"
        );
    }

    /// The words as the contract spells them.
    #[test]
    fn the_words_are_the_contracts() {
        let words = |all: &[&str]| all.join(",");
        let of = |v: Vec<&'static str>| v.join(",");
        assert_eq!(
            of(RunStatus::ALL.iter().map(|s| s.as_str()).collect()),
            words(&[
                "running",
                "completed",
                "stopped",
                "escalated",
                "aborted",
                "failed",
                "interrupted",
                "cancelled"
            ])
        );
        assert_eq!(
            of(StepStatus::ALL.iter().map(|s| s.as_str()).collect()),
            words(&[
                "running",
                "completed",
                "stopped",
                "escalated",
                "aborted",
                "failed",
                "skipped",
                "waiting"
            ])
        );
        assert_eq!(
            of(ApprovalStatus::ALL.iter().map(|s| s.as_str()).collect()),
            words(&["pending", "approved", "rejected", "timeout", "closed"])
        );
    }
}
