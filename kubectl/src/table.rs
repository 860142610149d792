//! Columns as kubectl prints them: upper-case headers, left-aligned, three spaces apart, no
//! trailing blanks.

/// The table of `header` and `rows` (rows shorter than the header are padded with blanks).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(widths.len()) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                out.push_str("   ");
            }
            out.push_str(cell);
            if i + 1 < cells.len() {
                out.extend(std::iter::repeat_n(' ', widths[i] - cell.chars().count()));
            }
        }
        out.trim_end().to_string()
    };
    let mut out = vec![line(header.to_vec())];
    for row in rows {
        let cells = (0..header.len())
            .map(|i| row.get(i).map_or("", String::as_str))
            .collect();
        out.push(line(cells));
    }
    out.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_under_their_headers() {
        let rows = vec![
            vec!["copy".to_string(), "Running".to_string(), "48%".to_string()],
            vec!["a-longer-name".to_string(), "Failed".to_string()],
        ];
        assert_eq!(
            table(&["NAME", "PHASE", "PROGRESS"], &rows),
            "NAME            PHASE     PROGRESS\n\
             copy            Running   48%\n\
             a-longer-name   Failed\n"
        );
    }
}
