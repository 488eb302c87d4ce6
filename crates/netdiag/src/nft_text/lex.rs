//! Tokens of nft's text syntax: words, quoted strings, braces and commas. A `;` is a word of
//! its own (the chain header's `priority filter; policy drop;`, a set block's lines joined).

/// One token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    Word(String),
    /// A quoted string, without its quotes (interface names, comments, log prefixes).
    Str(String),
    Open,
    Close,
    Comma,
}

impl Tok {
    pub fn word(&self) -> Option<&str> {
        match self {
            Tok::Word(w) => Some(w),
            _ => None,
        }
    }
}

/// Splits a line (or lines joined) into tokens; an unterminated string runs to the end.
pub fn lex(s: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        let single = match c {
            '"' => {
                let mut s = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => s.extend(chars.next()),
                        '"' => break,
                        _ => s.push(c),
                    }
                }
                flush(&mut cur, &mut out);
                out.push(Tok::Str(s));
                continue;
            }
            '{' => Tok::Open,
            '}' => Tok::Close,
            ',' => Tok::Comma,
            ';' => Tok::Word(";".into()),
            c if c.is_whitespace() => {
                flush(&mut cur, &mut out);
                continue;
            }
            c => {
                cur.push(c);
                continue;
            }
        };
        flush(&mut cur, &mut out);
        out.push(single);
    }
    flush(&mut cur, &mut out);
    out
}

fn flush(cur: &mut String, out: &mut Vec<Tok>) {
    if !cur.is_empty() {
        out.push(Tok::Word(std::mem::take(cur)));
    }
}

/// Tokens back to text, for a rule's part that was not read.
pub fn unlex(toks: &[Tok]) -> String {
    let mut s = String::new();
    for t in toks {
        let piece = match t {
            Tok::Word(w) => w.clone(),
            Tok::Str(x) => format!("{x:?}"),
            Tok::Open => "{".into(),
            Tok::Close => "}".into(),
            Tok::Comma => {
                s.push(',');
                continue;
            }
        };
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(&piece);
    }
    s
}

/// Braces a line opens minus those it closes, outside quoted strings.
pub fn depth_change(line: &str) -> i64 {
    let mut d = 0;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => d += 1,
            '}' if !quoted => d -= 1,
            _ => {}
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_strings_braces_and_commas() {
        let w = |s: &str| Tok::Word(s.into());
        assert_eq!(
            lex("iifname { \"eth0\", \"e,1\" } ct state established,related counter"),
            [
                w("iifname"),
                Tok::Open,
                Tok::Str("eth0".into()),
                Tok::Comma,
                Tok::Str("e,1".into()),
                Tok::Close,
                w("ct"),
                w("state"),
                w("established"),
                Tok::Comma,
                w("related"),
                w("counter")
            ]
        );
        assert_eq!(
            lex("priority filter; policy drop;"),
            [
                w("priority"),
                w("filter"),
                w(";"),
                w("policy"),
                w("drop"),
                w(";")
            ]
        );
        assert_eq!(
            depth_change("ip saddr { 1.2.3.4 } comment \"{\" accept {"),
            1
        );
    }
}
