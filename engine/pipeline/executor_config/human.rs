//! `human`: no `executor_config` keys. The approval message is the rendered
//! `prompt_template`; where it goes is `human_approval` in config.yaml.

use super::FieldSpec;

pub const FIELDS: &[FieldSpec] = &[];
