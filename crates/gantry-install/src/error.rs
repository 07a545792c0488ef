//! `InstallError`: why an installation failed, worded so that it says what to do next,
//! with the last lines the failing tool printed.

/// An installation that did not complete. `message` says what failed and what to do about
/// it; `log_tail` holds the last lines (at most [`gantry_types::INSTALL_LOG_TAIL_LINES`])
/// of the tool that was running, empty when no tool ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}{}", render_tail(.log_tail))]
pub struct InstallError {
    pub message: String,
    pub log_tail: Vec<String>,
}

impl InstallError {
    /// An error before or outside any tool run: no output to show.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            log_tail: Vec::new(),
        }
    }

    /// An error with the output that explains it.
    pub fn with_tail(message: impl Into<String>, log_tail: Vec<String>) -> Self {
        Self {
            message: message.into(),
            log_tail,
        }
    }

    /// The installation was cancelled by its caller (shutdown, or the instance went away).
    pub(crate) fn cancelled(what: &str) -> Self {
        Self::new(format!("{what} was cancelled"))
    }
}

fn render_tail(tail: &[String]) -> String {
    if tail.is_empty() {
        return String::new();
    }
    let mut rendered = String::from("\nlast output:");
    for line in tail {
        rendered.push_str("\n  ");
        rendered.push_str(line);
    }
    rendered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_shows_the_message_then_the_tail() {
        let error = InstallError::with_tail(
            "cmake build failed",
            vec!["first line".to_owned(), "second line".to_owned()],
        );
        assert_eq!(
            error.to_string(),
            "cmake build failed\nlast output:\n  first line\n  second line"
        );
        assert_eq!(InstallError::new("no tail").to_string(), "no tail");
    }
}
