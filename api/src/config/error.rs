//! Why a configuration could not be used: a read or parse error, or every invalid field.

use std::fmt;

/// One invalid field: its path in the document (`optimizer.lr`) and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Syntax, unknown field, wrong type: the parser's message names the field and the location.
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    /// Every semantic problem found, each naming its field.
    #[error("{origin}: invalid config:\n{}", .errors.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        origin: String,
        errors: Vec<FieldError>,
    },
}

impl ConfigError {
    /// A single-line summary (for termination messages and Kubernetes events).
    pub fn one_line(&self) -> String {
        match self {
            ConfigError::Invalid { origin, errors } => format!(
                "{origin}: invalid config: {}",
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            other => other.to_string().replace('\n', " "),
        }
    }
}
