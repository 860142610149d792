//! Where rank 0 writes TensorBoard event files.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults::{self, impl_default_from_serde};

/// TensorBoard event files: rank 0 writes one run directory per attempt, `attempt-<N>/`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TensorBoardConfig {
    /// Write them.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// Directory that gets `<job>/attempt-<N>/` (one directory can serve several jobs to one
    /// TensorBoard); default: `tensorboard/` in the job's checkpoint directory. Relative paths
    /// resolve against the working directory. In Kubernetes it must be on a volume rank 0's
    /// pod mounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

impl_default_from_serde!(TensorBoardConfig);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::fixtures::MINIMAL;
    use crate::config::{ConfigError, TrainerConfig};

    #[test]
    fn tensorboard_is_on_by_default_and_its_dir_checked() {
        let c = TrainerConfig::from_yaml(MINIMAL, "t").unwrap();
        assert_eq!(
            c.tensorboard,
            TensorBoardConfig {
                enabled: true,
                dir: None
            }
        );
        let c = TrainerConfig::from_yaml(
            &format!("{MINIMAL}tensorboard: {{enabled: false, dir: /tb}}\n"),
            "t",
        )
        .unwrap();
        assert!(!c.tensorboard.enabled);
        assert_eq!(c.tensorboard.dir.as_deref(), Some("/tb"));
        let Err(ConfigError::Invalid { errors, .. }) =
            TrainerConfig::from_yaml(&format!("{MINIMAL}tensorboard: {{dir: ' '}}\n"), "t")
        else {
            panic!("expected invalid");
        };
        assert_eq!(errors[0].path, "tensorboard.dir");
    }
}
