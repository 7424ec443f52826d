//! The file under the flags: every setting the command line (or the
//! environment) gives wins over the file's, whatever its type or place, by
//! one rule over the settings as data rather than a line per setting.

use super::Settings;
use std::path::Path;
use toml::Value;

/// The file's settings with each one `flags` sets put over it.
pub(super) fn over_file(flags: &Settings, path: &Path) -> Result<Settings, String> {
    let file = load(path)?;
    // TOML's values, not JSON's: a float that is not finite (a flag given
    // `nan`) stays itself and is refused by the checks, never made absent.
    let mut merged = Value::try_from(&file).expect("settings are plain data");
    overlay(&mut merged, Value::try_from(flags).expect("settings are plain data"));
    Ok(merged.try_into().expect("both layers were settings"))
}

/// Puts every value of `top` (its unset ones are absent) over `base`,
/// table by table.
fn overlay(base: &mut Value, top: Value) {
    match (base, top) {
        (Value::Table(base), Value::Table(top)) => {
            for (key, value) in top {
                match base.get_mut(&key) {
                    Some(b) => overlay(b, value),
                    None => {
                        base.insert(key, value);
                    }
                }
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

    #[test]
    fn what_the_top_sets_wins_and_the_rest_stays() {
        let table = |text: &str| text.parse::<toml::Table>().map(Value::Table).unwrap();
        let mut base = table("a = 1\ne = [1, 2]\n[b]\nc = 2\nd = 3\n");
        overlay(&mut base, table("e = [3]\nf = \"new\"\n[b]\nc = 5\n"));
        assert_eq!(base, table("a = 1\ne = [3]\nf = \"new\"\n[b]\nc = 5\nd = 3\n"));
    }

    #[test]
    fn a_flag_that_is_not_a_finite_number_stays_set() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), "lease_seconds = 3.0\n").unwrap();
        let flags = Settings { lease_seconds: Some(f64::NAN), ..Settings::default() };
        assert!(over_file(&flags, tmp.path()).unwrap().lease_seconds.unwrap().is_nan());
    }
}
