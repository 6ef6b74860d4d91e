//! The values the bench suites put in their rows: serde_json's `Value` (objects keep their fields'
//! order), with the two constructors the suites use. Files are written by
//! `results_file::ResultsFile::render`.

pub use serde_json::Value as Json;

/// An object with `fields` in this order.
pub fn obj(fields: impl IntoIterator<Item = (&'static str, Json)>) -> Json {
    Json::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// A number: whole values as integers (shapes, counts), others as floats; NaN and infinities
/// (which JSON lacks) as null.
pub fn num(x: f64) -> Json {
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15 {
        Json::from(x as i64)
    } else {
        Json::from(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_keep_their_order_and_numbers_their_kind() {
        let j = obj([
            ("z", Json::from("a\"b")),
            ("n", num(2.5)),
            ("i", num(3.0)),
            ("nan", num(f64::NAN)),
            ("inf", Json::from(f64::INFINITY)),
            ("none", Json::from(None::<f64>)),
        ]);
        assert_eq!(
            serde_json::to_string(&j).unwrap(),
            r#"{"z":"a\"b","n":2.5,"i":3,"nan":null,"inf":null,"none":null}"#
        );
    }
}
