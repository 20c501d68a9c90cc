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

/// Gives SIGPIPE back its default action. Rust's runtime ignores it at
/// startup, and an ignored signal stays ignored across fork and exec: every
/// container runsbx starts would inherit that, and `yes | head` in a
/// sandbox would spin on EPIPE forever instead of ending. Called first
/// thing in main, before any container exists.
pub fn restore_default_sigpipe() {
    // SAFETY: setting a signal's disposition to its default installs no
    // handler; nothing runs on another thread yet.
    let _ =
        unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) };
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
