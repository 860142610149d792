//! The one-line reason Kubernetes shows as a container's termination message: a rank's, or
//! its launcher's (which becomes the pod's).

use ferrotrain_api::env;

/// Kubernetes keeps at most 4096 bytes of a termination message; this leaves room.
const MAX_BYTES: usize = 4000;

/// Writes `message` (one line, cut at [`MAX_BYTES`] on a character boundary) where
/// FERROTRAIN_TERMINATION_LOG says, else to /dev/termination-log. Best effort: a missing or
/// read-only file is not an error.
pub fn write_termination_message(message: &str) {
    let path = std::env::var(env::FERROTRAIN_TERMINATION_LOG)
        .unwrap_or_else(|_| env::TERMINATION_LOG.to_string());
    let _ = std::fs::write(path, one_line(message));
}

/// `message` on one line, at most [`MAX_BYTES`].
fn one_line(message: &str) -> String {
    let mut line: String = message.replace('\n', " ");
    if line.len() > MAX_BYTES {
        let mut cut = MAX_BYTES;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_one_line_cut_on_a_character_boundary() {
        assert_eq!(one_line("a\nb"), "a b");
        let long = "é".repeat(3000);
        let cut = one_line(&long);
        assert!(
            cut.len() <= MAX_BYTES && cut.len() >= MAX_BYTES - 1,
            "{}",
            cut.len()
        );
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
