//! Pickles built by hand for the snapshot readers' tests, as serde-pickle writes them.

/// `value` pickled by serde-pickle (protocol 3).
pub fn pickled(value: &serde_pickle::Value) -> Vec<u8> {
    serde_pickle::value_to_vec(value, serde_pickle::SerOptions::new()).unwrap()
}

/// A Python dict of string keys.
pub fn dict(entries: Vec<(&str, serde_pickle::Value)>) -> serde_pickle::Value {
    serde_pickle::Value::Dict(
        entries
            .into_iter()
            .map(|(key, value)| (serde_pickle::HashableValue::String(key.to_owned()), value))
            .collect(),
    )
}
