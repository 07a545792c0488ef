//! File-name globs as Hugging Face's `allow_patterns` read them (Python's `fnmatch`):
//! `*` matches any run of characters, `/` included; `?` one character; `[abc]`, `[a-z]`
//! and `[!abc]` one character of a set.

/// Whether `pattern` has glob characters (else it names one path).
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

/// Whether `text` matches `pattern` as a whole.
pub fn matches(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    match_from(&pattern, &text)
}

fn match_from(pattern: &[char], text: &[char]) -> bool {
    // Iterative with one backtrack point for the last `*`: linear in practice.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                '*' => {
                    star = Some((p, t));
                    p += 1;
                    continue;
                }
                '?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                '[' => {
                    if let Some((matched, next)) = class(&pattern[p..], text[t]) {
                        if matched {
                            p += next;
                            t += 1;
                            continue;
                        }
                    } else if text[t] == '[' {
                        // An unclosed `[` is a plain character.
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
                c if c == text[t] => {
                    p += 1;
                    t += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, st)) => {
                p = sp + 1;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// Matches one character against the class at the start of `pattern` (`[...]`); returns
/// whether it matched and the class's length, or `None` when the class is not closed.
fn class(pattern: &[char], c: char) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = matches!(pattern.get(i), Some('!' | '^'));
    if negate {
        i += 1;
    }
    let start = i;
    let mut matched = false;
    while i < pattern.len() {
        if pattern[i] == ']' && i > start {
            return Some((matched != negate, i + 1));
        }
        if pattern.get(i + 1) == Some(&'-') && pattern.get(i + 2).is_some_and(|e| *e != ']') {
            if pattern[i] <= c && c <= pattern[i + 2] {
                matched = true;
            }
            i += 3;
        } else {
            if pattern[i] == c {
                matched = true;
            }
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_fnmatch_does() {
        let cases = [
            ("*Q4_K_M.gguf", "qwen2.5-7b-instruct-Q4_K_M.gguf", true),
            ("*Q4_K_M.gguf", "sub/dir/model-Q4_K_M.gguf", true),
            ("*Q4_K_M.gguf", "model-Q8_0.gguf", false),
            ("*.json", "config.json", true),
            ("*.json", "config.json.bak", false),
            (
                "model-?????-of-00003.gguf",
                "model-00002-of-00003.gguf",
                true,
            ),
            ("model-[0-9]*.gguf", "model-1.gguf", true),
            ("model-[!0-9]*.gguf", "model-1.gguf", false),
            ("model-[!0-9]*.gguf", "model-x.gguf", true),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("exact.gguf", "exact.gguf", true),
            ("[oops", "[oops", true),
            ("", "", true),
            ("*", "", true),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(matches(pattern, text), expected, "{pattern} vs {text}");
        }
        assert!(is_glob("*.gguf") && is_glob("a?") && is_glob("[ab]"));
        assert!(!is_glob("model.gguf"));
    }
}
