//! Redrawing a few lines in place on a terminal, as cargo's and docker's progress do: the
//! cursor goes back up over the last frame, each line is rewritten and cleared to its end, and
//! the last frame stays on the screen when the command ends (no alternate screen). Lines are
//! cut to the terminal's width: a wrapped line would throw the count of lines to go back.

use std::io::Write;

/// Writes frames of lines over each other on stdout.
#[derive(Debug, Default)]
pub struct Frames {
    /// Lines of the last frame.
    drawn: usize,
}

impl Frames {
    /// Replaces the last frame with `lines`.
    pub fn draw(&mut self, lines: &[String]) -> std::io::Result<()> {
        let text = frame(self.drawn, lines, width());
        self.drawn = lines.len();
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()
    }
}

/// The bytes that replace a frame of `drawn` lines with `lines`, each cut to `width`.
pub fn frame(drawn: usize, lines: &[String], width: usize) -> String {
    let mut out = String::new();
    if drawn > 0 {
        out += &format!("\x1b[{drawn}A");
    }
    out.push('\r');
    for line in lines {
        out += &fit(line, width);
        out += "\x1b[K\n";
    }
    // Whatever the last frame had below this one.
    out += "\x1b[J";
    out
}

/// `line` cut to `width` characters (a cut line ends in `…` would be wider on some terminals:
/// it ends in `~`).
pub fn fit(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_string();
    }
    let mut out: String = line.chars().take(width.saturating_sub(1)).collect();
    out.push('~');
    out
}

/// The terminal's columns (stdout's), else $COLUMNS, else 80.
pub fn width() -> usize {
    // SAFETY: TIOCGWINSZ writes a winsize into the struct we pass and nothing else.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_col > 0 {
        return usize::from(size.ws_col);
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|c| *c > 0)
        .unwrap_or(80)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_goes_back_over_the_last_one_and_clears_what_is_left() {
        let lines = vec!["a".to_string(), "bb".to_string()];
        assert_eq!(frame(0, &lines, 80), "\ra\x1b[K\nbb\x1b[K\n\x1b[J");
        assert_eq!(frame(3, &lines, 80), "\x1b[3A\ra\x1b[K\nbb\x1b[K\n\x1b[J");
    }

    #[test]
    fn lines_are_cut_to_the_width() {
        assert_eq!(fit("abcdef", 4), "abc~");
        assert_eq!(fit("abcd", 4), "abcd");
        assert_eq!(fit("é€ab", 3), "é€~");
    }
}
