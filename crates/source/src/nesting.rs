//! A cheap pre-scan bounding how deeply a YAML text nests, so that pathological input
//! (hundreds of thousands of `[` or `- `) is refused in linear time instead of stalling the
//! YAML parser, whose cost grows about quadratically with depth.
//!
//! The estimate counts open flow collections (`[`, `{` outside quotes and comments) plus the
//! compact block indicators (`- `, `? `) that start a line. Indentation-only nesting is not
//! counted: each level costs a column on every line below it, so the file-size cap already
//! bounds it to a few thousand levels, which parse quickly.

/// The 1-based line on which the estimated nesting first exceeds `max`, if it does.
pub fn exceeds(text: &str, max: usize) -> Option<usize> {
    let mut flow = 0usize;
    let mut quote: Option<u8> = None;
    let mut escaped = false;
    let mut comment = false;
    let mut line = 1usize;
    let mut line_start = true;
    let mut indicators = 0usize;
    // The previous byte allows a token to start here (start of line, blank, or flow punctuation).
    let mut token_start = true;
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\n' {
            line += 1;
            line_start = true;
            indicators = 0;
            comment = false;
            token_start = true;
            continue;
        }
        if comment {
            continue;
        }
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if q == b'"' && b == b'\\' {
                escaped = true;
            } else if b == q {
                quote = None;
            }
            continue;
        }
        let next_blank = bytes
            .get(i + 1)
            .is_none_or(|n| matches!(n, b' ' | b'\t' | b'\n'));
        if line_start {
            match b {
                b' ' | b'\t' => continue,
                b'-' | b'?' if next_blank => {
                    indicators += 1;
                    if flow + indicators > max {
                        return Some(line);
                    }
                    continue;
                }
                _ => line_start = false,
            }
        }
        match b {
            b'#' if token_start => comment = true,
            b'"' | b'\'' if token_start || flow > 0 => quote = Some(b),
            b'[' | b'{' if token_start || flow > 0 => {
                flow += 1;
                if flow + indicators > max {
                    return Some(line);
                }
            }
            b']' | b'}' if flow > 0 => flow -= 1,
            _ => {}
        }
        token_start = matches!(b, b' ' | b'\t' | b'[' | b'{' | b',' | b':');
    }
    None
}

#[cfg(test)]
mod tests {
    use super::exceeds;

    #[test]
    fn ordinary_manifests_pass() {
        let svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: a # [not {counted\n  \
                   annotations: {x: \"[[[[\", y: 'it''s [ ok'}\nspec:\n  ports:\n  - {port: 80}\n  \
                   - port: 81\n    name: don't[\n";
        assert_eq!(exceeds(svc, 3), None);
    }

    #[test]
    fn deep_flow_and_compact_block_nesting_are_caught_with_their_line() {
        let flow = format!("a: 1\nb: {}{}\n", "[".repeat(50), "]".repeat(50));
        assert_eq!(exceeds(&flow, 49), Some(2));
        assert_eq!(exceeds(&flow, 50), None);
        let block = format!("x: 1\n---\n{}x\n", "- ".repeat(30));
        assert_eq!(exceeds(&block, 20), Some(3));
        assert_eq!(exceeds(&block, 30), None);
        // 200k levels (the reproduction that stalled the parser for 91 s) in linear time.
        let deep = "[".repeat(200_000);
        assert_eq!(exceeds(&deep, 100), Some(1));
    }
}
