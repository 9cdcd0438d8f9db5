//! Error text for people: an error and its causes on one line, each cause once.

/// An error and its causes on one line, each cause once (`a: b: c`).
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![error.to_string()];
    let mut next = error.source();
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Wrap(String, #[source] std::io::Error);

    #[test]
    fn every_cause_is_named_once() {
        let e = Wrap(
            "transport error".into(),
            std::io::Error::other("access denied"),
        );
        assert_eq!(chain(&e), "transport error: access denied");
        // A cause that its wrapper already quotes is not said twice.
        let e = Wrap(
            "connecting failed: access denied".into(),
            std::io::Error::other("access denied"),
        );
        assert_eq!(chain(&e), "connecting failed: access denied");
    }
}
