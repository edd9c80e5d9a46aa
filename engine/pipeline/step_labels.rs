//! The step each index path of a pipeline file names, so a diagnostic at
//! `steps[1].parallel.steps[0].executor` can also say `(context/deploys)`: an
//! operator looks for steps by name, not by position. Read from the YAML tree
//! alone (a file with errors has no validated steps), so it is a leaf that knows
//! only the shape of `steps`, `parallel` and `fan_out`.

use crate::yaml::Node;

/// `(index path, step path)` for every named entry of `root`'s `steps`, nested
/// group branches included: `("steps[1]", "context")`,
/// `("steps[1].parallel.steps[0]", "context/deploys")`.
pub fn step_labels(root: &Node) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(items) = root.get("steps").and_then(Node::as_seq) {
        for (i, item) in items.iter().enumerate() {
            let at = format!("steps[{i}]");
            let (body, group_key) = match (item.get("parallel"), item.get("fan_out")) {
                (Some(p), _) => (p, Some("parallel")),
                (None, Some(f)) => (f, Some("fan_out")),
                _ => (item, None),
            };
            let Some(name) = body.get("name").and_then(Node::scalar_text) else {
                continue;
            };
            out.push((at.clone(), name.clone()));
            if group_key == Some("parallel") {
                for (j, branch) in body
                    .get("steps")
                    .and_then(Node::as_seq)
                    .unwrap_or(&[])
                    .iter()
                    .enumerate()
                {
                    if let Some(b) = branch.get("name").and_then(Node::scalar_text) {
                        out.push((format!("{at}.parallel.steps[{j}]"), format!("{name}/{b}")));
                    }
                }
            }
        }
    }
    out
}

/// `path` with the step path after each index path it starts with:
/// `steps[1].parallel.steps[0].executor` ->
/// `steps[1] (context).parallel.steps[0] (context/deploys).executor`.
pub fn label_path(path: &str, labels: &[(String, String)]) -> String {
    let mut found: Vec<&(String, String)> = labels
        .iter()
        .filter(|(at, _)| {
            path.strip_prefix(at.as_str()).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with('.') || rest.starts_with('[')
            })
        })
        .collect();
    // Longest first: each insertion is after the prefix, so shorter ones stay put.
    found.sort_by_key(|(at, _)| std::cmp::Reverse(at.len()));
    let mut out = path.to_string();
    for (at, name) in found {
        out.insert_str(at.len(), &format!(" ({name})"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_paths_are_labelled_with_their_step() {
        let yaml = "steps:\n  - {name: triage, executor: mock}\n  - parallel:\n      name: context\n      steps:\n        - {name: deploys, executor: mock}\n        - {executor: mock}\n  - fan_out: {name: each, over: '[]', executor: mock}\n  - {executor: mock}\n";
        let root = crate::yaml::parse(&std::sync::Arc::from("p.yaml"), yaml).unwrap();
        let labels = step_labels(&root);
        let rows = [
            (
                "steps[0].executor_config.command",
                "steps[0] (triage).executor_config.command",
            ),
            (
                "steps[1].parallel.steps[0].executor",
                "steps[1] (context).parallel.steps[0] (context/deploys).executor",
            ),
            (
                "steps[1].parallel.steps[1].name",
                "steps[1] (context).parallel.steps[1].name",
            ),
            ("steps[2].fan_out.over", "steps[2] (each).fan_out.over"),
            ("steps[3].name", "steps[3].name"),
            ("steps[10].name", "steps[10].name"),
            ("steps[1]", "steps[1] (context)"),
            ("trigger.match", "trigger.match"),
            ("", ""),
        ];
        for (path, want) in rows {
            assert_eq!(label_path(path, &labels), want, "{path}");
        }
    }
}
