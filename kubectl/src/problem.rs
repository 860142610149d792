//! A problem of an object `submit` was given: the field, and what is wrong with it.

/// One problem of an object: the field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// `spec.trainer.optimizer.lr`; empty for the object itself.
    pub path: String,
    pub message: String,
}

impl Problem {
    pub fn new(path: &str, message: &str) -> Problem {
        Problem {
            path: path.to_string(),
            message: message.to_string(),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}
