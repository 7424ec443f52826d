//! The file under the flags: every setting the command line (or the
//! environment) gives wins over the file's, whatever its type or place, by
//! one rule over the settings as data rather than a line per setting.

use super::Settings;
use serde_json::Value;
use std::path::Path;

/// The file's settings with each one `flags` sets put over it.
pub(super) fn over_file(flags: &Settings, path: &Path) -> Result<Settings, String> {
    let file = load(path)?;
    let mut merged = serde_json::to_value(&file).expect("settings are plain data");
    overlay(&mut merged, serde_json::to_value(flags).expect("settings are plain data"));
    Ok(serde_json::from_value(merged).expect("both layers were settings"))
}

/// Puts every value of `top` that is set over `base`, table by table.
fn overlay(base: &mut Value, top: Value) {
    match (base, top) {
        (_, Value::Null) => {}
        (Value::Object(base), Value::Object(top)) => {
            for (key, value) in top {
                overlay(base.entry(key).or_insert(Value::Null), value);
            }
        }
        (base, top) => *base = top,
    }
}

/// The file's settings; a key that names none is an error.
fn load(path: &Path) -> Result<Settings, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read the config file {}: {e}", path.display()))?;
    let file: Settings =
        toml::from_str(&text).map_err(|e| format!("the config file {} is not valid: {e}", path.display()))?;
    let unknown = (file.unknown.keys().next().cloned())
        .or_else(|| file.source.unknown.keys().next().map(|k| format!("{k}` in `[source]")))
        .or_else(|| file.sink.unknown.keys().next().map(|k| format!("{k}` in `[sink]")));
    if let Some(key) = unknown {
        return Err(format!(
            "the config file {} is not valid: unknown field `{key}`; the settings are the flags of `skipprd run \
             --help` in snake_case, with [source] and [sink] tables",
            path.display()
        ));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_the_top_sets_wins_and_the_rest_stays() {
        let mut base = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2]});
        overlay(&mut base, json!({"a": null, "b": {"c": 5, "d": null}, "e": [3], "f": "new"}));
        assert_eq!(base, json!({"a": 1, "b": {"c": 5, "d": 3}, "e": [3], "f": "new"}));
    }
}
