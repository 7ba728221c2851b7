//! The doctor's findings: checks with a status, what was seen and what to do, printed one line
//! per check for people or as JSON for scripts (field names and status words are stable).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    /// What was observed, in one line.
    pub detail: String,
    /// What to do about it, in one line: present exactly when the check did not pass.
    pub remedy: Option<String>,
}

impl Check {
    pub fn pass(name: &str, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            status: Status::Pass,
            detail: detail.into(),
            remedy: None,
        }
    }

    pub fn warn(name: &str, detail: impl Into<String>, remedy: impl Into<String>) -> Self {
        Self {
            status: Status::Warn,
            remedy: Some(remedy.into()),
            ..Self::pass(name, detail)
        }
    }

    pub fn fail(name: &str, detail: impl Into<String>, remedy: impl Into<String>) -> Self {
        Self {
            status: Status::Fail,
            ..Self::warn(name, detail, remedy)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub checks: Vec<Check>,
    /// How many checks failed: `shaper doctor` exits non-zero when any did.
    pub failed: usize,
    pub warned: usize,
}

impl Report {
    pub fn new(checks: Vec<Check>) -> Self {
        let count = |s| checks.iter().filter(|c| c.status == s).count();
        Self {
            failed: count(Status::Fail),
            warned: count(Status::Warn),
            checks,
        }
    }

    /// One line per check (status, name, detail; names aligned), the remedy indented on the
    /// next line of each that did not pass, and a count at the end.
    pub fn to_text(&self) -> String {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for c in &self.checks {
            out += &format!("{:<4}  {:<width$}  {}\n", c.status.word(), c.name, c.detail);
            if let Some(remedy) = &c.remedy {
                out += &format!("{:<4}  {:<width$}  -> {remedy}\n", "", "");
            }
        }
        out += &format!(
            "{} checks: {} passed, {} warned, {} failed\n",
            self.checks.len(),
            self.checks.len() - self.failed - self.warned,
            self.warned,
            self.failed
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        Report::new(vec![
            Check::pass("btf", "present"),
            Check::fail("sch_fq", "missing", "modprobe sch_fq"),
            Check::warn("clocksource", "hpet", "use tsc"),
        ])
    }

    #[test]
    fn counts_failures_and_warnings() {
        let r = sample();
        assert_eq!((r.failed, r.warned), (1, 1));
        assert_eq!(Report::new(vec![]).failed, 0);
    }

    #[test]
    fn text_aligns_names_and_indents_remedies_under_non_passing_checks() {
        let text = sample().to_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "pass  btf          present");
        assert_eq!(lines[1], "FAIL  sch_fq       missing");
        assert_eq!(lines[2], "                   -> modprobe sch_fq");
        assert_eq!(lines[3], "warn  clocksource  hpet");
        assert_eq!(lines[4], "                   -> use tsc");
        assert_eq!(lines[5], "3 checks: 1 passed, 1 warned, 1 failed");
        assert_eq!(lines.len(), 6);
    }

    #[test]
    fn json_has_the_stable_field_names_and_lowercase_statuses() {
        let json: serde_json::Value = serde_json::to_value(sample()).unwrap();
        assert_eq!(json["failed"], 1);
        assert_eq!(json["checks"][1]["name"], "sch_fq");
        assert_eq!(json["checks"][1]["status"], "fail");
        assert_eq!(json["checks"][1]["remedy"], "modprobe sch_fq");
        assert_eq!(json["checks"][0]["status"], "pass");
        // A passing check has a null remedy, not a missing key.
        assert!(json["checks"][0].as_object().unwrap()["remedy"].is_null());
        let back: Report = serde_json::from_value(json).unwrap();
        assert_eq!(back, sample());
    }
}
