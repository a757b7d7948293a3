//! What every configuration section shares: its checks collect
//! [`Problems`] naming each key in full, and its user reference is
//! [`ConfigKeys`], derived from the fields' doc comments.
//!
//! Durations are `std::time::Duration` fields read and written as whole
//! milliseconds by [`crate::time::serde_millis`], under a key ending in
//! `_ms`: one representation for every section.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

pub use belfry_config_derive::ConfigKeys;

/// One key of a section, as the reference shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDoc {
    /// Dotted, relative to the section that lists it.
    pub key: String,
    /// The field's doc comment on one line.
    pub doc: &'static str,
    /// Shown as the default instead of the serialized default value.
    pub default: Option<&'static str>,
    /// Only the TOML file sets it (no environment variable).
    pub toml_only: bool,
}

/// The keys of a configuration section (`#[derive(ConfigKeys)]`).
pub trait ConfigKeys {
    fn config_keys() -> Vec<KeyDoc>;
}

/// An optional section has the keys of the section.
impl<T: ConfigKeys> ConfigKeys for Option<T> {
    fn config_keys() -> Vec<KeyDoc> {
        T::config_keys()
    }
}

/// A table of sections by name: `"NAME".key`, set in the TOML file only.
impl<T: ConfigKeys> ConfigKeys for BTreeMap<String, T> {
    fn config_keys() -> Vec<KeyDoc> {
        T::config_keys()
            .into_iter()
            .map(|doc| KeyDoc {
                key: format!("\"NAME\".{}", doc.key),
                toml_only: true,
                ..doc
            })
            .collect()
    }
}

/// Every problem found in a configuration, each naming its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(Vec<String>);

impl ConfigError {
    pub fn problems(&self) -> &[String] {
        &self.0
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("; "))
    }
}

impl std::error::Error for ConfigError {}

/// Collects the problems of a section and the sections nested in it.
#[derive(Debug, Default)]
pub struct Problems {
    /// The section being checked, dotted (empty: the top level).
    section: String,
    found: Vec<String>,
}

impl Problems {
    /// Checks one section named `section` (dotted) on its own.
    ///
    /// # Errors
    /// What `check` found.
    pub fn check(section: &str, check: impl FnOnce(&mut Problems)) -> Result<(), ConfigError> {
        let mut problems = Problems::default();
        problems.section(section, check);
        problems.finish()
    }

    /// Runs `check` on the nested section `name`.
    pub fn section(&mut self, name: &str, check: impl FnOnce(&mut Problems)) {
        let outer = self.section.len();
        if !self.section.is_empty() {
            self.section.push('.');
        }
        self.section.push_str(name);
        check(self);
        self.section.truncate(outer);
    }

    /// The full name of `key` in the section being checked.
    pub fn key(&self, key: &str) -> String {
        if self.section.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.section)
        }
    }

    /// A problem; it names its keys with [`Problems::key`].
    pub fn push(&mut self, problem: impl Into<String>) {
        self.found.push(problem.into());
    }

    /// `key` must not be zero: a zero interval, timeout or limit where zero
    /// has no meaning of its own.
    pub fn at_least_one(&mut self, key: &str, value: impl Amount) {
        if value.is_zero() {
            let key = self.key(key);
            self.push(format!("{key} must be at least 1, not 0"));
        }
    }

    /// # Errors
    /// Every problem found.
    pub fn finish(self) -> Result<(), ConfigError> {
        if self.found.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(self.found))
        }
    }
}

/// A count, size or duration that [`Problems::at_least_one`] checks.
pub trait Amount {
    fn is_zero(&self) -> bool;
}

macro_rules! amount {
    ($($t:ty),*) => {$(
        impl Amount for $t {
            fn is_zero(&self) -> bool {
                *self == 0
            }
        }
    )*};
}
amount!(u16, u32, u64, usize);

impl Amount for Duration {
    fn is_zero(&self) -> bool {
        Duration::is_zero(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_their_keys_in_full() {
        let error = Problems::check("engine", |problems| {
            problems.at_least_one("window_ms", Duration::ZERO);
            problems.at_least_one("max_in_flight", 4_usize);
            problems.section("retry", |problems| {
                problems.at_least_one("max_delay_ms", Duration::ZERO);
            });
            let key = problems.key("lookback_ms");
            problems.push(format!("{key} is odd"));
        })
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "engine.window_ms must be at least 1, not 0; \
             engine.retry.max_delay_ms must be at least 1, not 0; engine.lookback_ms is odd"
        );
        assert_eq!(Problems::check("api", |_| {}), Ok(()));
    }

    #[derive(ConfigKeys, serde::Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        /// Seconds
        /// of it.
        #[serde(rename = "wait_ms")]
        wait: u64,
    }

    #[derive(ConfigKeys, serde::Deserialize)]
    #[allow(dead_code)]
    struct Outer {
        /// A name.
        #[config(default = "the host's")]
        name: String,
        #[config(section)]
        inner: Inner,
        #[config(section)]
        tenants: BTreeMap<String, Inner>,
        #[serde(skip)]
        hidden: u8,
    }

    #[test]
    fn keys_are_derived_from_fields_and_doc_comments() {
        let keys = Outer::config_keys();
        let names: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(names, ["name", "inner.wait_ms", "tenants.\"NAME\".wait_ms"]);
        assert_eq!(keys[0].default, Some("the host's"));
        assert_eq!(keys[1].doc, "Seconds of it.");
        assert!(!keys[1].toml_only);
        assert!(keys[2].toml_only);
    }
}
