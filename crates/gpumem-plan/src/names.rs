//! Name lookup with suggestions: case-insensitive matching and edit-distance "did you mean".

use crate::error::PlanError;

/// Normalises a user-typed name: lower case, `_` and spaces as `-`.
pub fn normalise(name: &str) -> String {
    name.trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c == '_' || c == ' ' { '-' } else { c })
        .collect()
}

/// Levenshtein distance between two strings (by chars).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

/// Up to three accepted names nearest to `given`: names containing it first, then by edit distance.
pub fn nearest<'a>(given: &str, accepted: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let given = normalise(given);
    let chars = given.chars().count();
    let mut scored: Vec<(usize, &str)> = accepted
        .into_iter()
        .filter_map(|name| {
            let limit = (name.len().max(given.len()) / 2).max(2);
            let distance = if !given.is_empty() && name.contains(given.as_str()) {
                0
            } else if chars.abs_diff(name.chars().count()) > limit {
                // The distance is at least the difference in length: too far, without the
                // quadratic comparison (a name of 10⁵ characters against every accepted name).
                return None;
            } else {
                edit_distance(&given, name)
            };
            (distance <= limit).then_some((distance, name))
        })
        .collect();
    scored.sort();
    scored
        .into_iter()
        .take(3)
        .map(|(_, name)| name.to_string())
        .collect()
}

/// Looks `given` up in a table of `(name, value)`; unknown names give [`PlanError::UnknownName`].
pub fn lookup<T: Clone>(
    kind: &'static str,
    given: &str,
    table: &[(&str, T)],
) -> Result<T, PlanError> {
    let key = normalise(given);
    table
        .iter()
        .find(|(name, _)| *name == key)
        .map(|(_, value)| value.clone())
        .ok_or_else(|| unknown(kind, given, table.iter().map(|(name, _)| *name)))
}

/// Builds the [`PlanError::UnknownName`] for `given` against the accepted names.
pub fn unknown<'a>(
    kind: &'static str,
    given: &str,
    accepted: impl IntoIterator<Item = &'a str> + Clone,
) -> PlanError {
    PlanError::UnknownName {
        kind,
        given: given.to_string(),
        nearest: nearest(given, accepted.clone()),
        accepted: accepted.into_iter().map(str::to_string).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_counts_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("gpt2", "gpt2"), 0);
    }

    #[test]
    fn nearest_prefers_close_names() {
        let names = ["llama-2-7b", "llama-3-8b", "gpt2", "mistral-7b"];
        assert_eq!(nearest("lama-2-7b", names)[0], "llama-2-7b");
        assert!(nearest("zzzzzzzzzzzz", names).is_empty());
    }
}
