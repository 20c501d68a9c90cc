//! Signal names and numbers as `kill` takes them.

use std::str::FromStr;

use nix::sys::signal::Signal;

use crate::error::{Result, RuntimeError};

/// Parses `KILL`, `SIGKILL`, `kill` or `9`.
pub fn parse(text: &str) -> Result<Signal> {
    let bad = || {
        RuntimeError::invalid(
            format!("signal {text:?}"),
            "not a signal (use a name such as TERM or SIGKILL, or a number 1-31)",
        )
    };
    if let Ok(n) = text.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| bad());
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    Signal::from_str(&name).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        for (text, sig) in [
            ("KILL", Signal::SIGKILL),
            ("SIGKILL", Signal::SIGKILL),
            ("kill", Signal::SIGKILL),
            ("9", Signal::SIGKILL),
            ("TERM", Signal::SIGTERM),
            ("15", Signal::SIGTERM),
            ("SIGUSR1", Signal::SIGUSR1),
        ] {
            assert_eq!(parse(text).ok(), Some(sig), "{text}");
        }
        for text in ["", "0", "65", "-1", "FOO", "SIG"] {
            assert!(parse(text).is_err(), "{text:?} was accepted");
        }
    }
}
