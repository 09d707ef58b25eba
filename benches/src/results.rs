//! The `results.json` schema: every figure with its section, case, value and unit, plus a
//! description of the machine. `cargo xtask report` renders it into `report.md` and SVG plots.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Schema version written into `results.json`.
pub const SCHEMA: u32 = 1;

/// The whole report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    /// [`SCHEMA`].
    pub schema: u32,
    /// Where it ran.
    pub machine: Machine,
    /// Sections run, in order.
    pub sections: Vec<String>,
    /// Every measured figure.
    pub figures: Vec<Figure>,
    /// Why something was skipped, or what a reader should know.
    pub notes: Vec<Note>,
}

/// The machine a run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model from `/proc/cpuinfo`.
    pub cpu: String,
    /// Cores available to the process.
    pub cores: usize,
    /// Physical memory in bytes.
    pub ram_bytes: u64,
    /// `Device::cuda(0).name()`, or `None` without a GPU.
    pub gpu: Option<String>,
    /// Whether a CUDA driver could be loaded.
    pub cuda_available: bool,
    /// Why CUDA cannot be used, when it cannot.
    pub cuda_reason: Option<String>,
    /// `uname`-style OS and architecture.
    pub os: String,
    /// When the run started, ISO 8601 UTC.
    pub date_utc: String,
    /// Whether this was a `--quick` run.
    pub quick: bool,
    /// The longshore version measured.
    pub longshore_version: String,
}

/// One measured figure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    /// `bandwidth`, `pool`, `loader`, `overlap` or `pytorch`.
    pub section: String,
    /// What was measured, human-readable and unique within the section.
    pub case: String,
    /// The value.
    pub value: f64,
    /// Its unit (`GB/s`, `x`, `ns`, `samples/s`, `fraction`, `ms`).
    pub unit: String,
    /// Structured parameters of the case (direction, kind, bytes, workload, num_workers...).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub params: Map<String, Value>,
}

/// A note attached to a section.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Note {
    /// The section.
    pub section: String,
    /// The text.
    pub text: String,
}

impl Results {
    /// Adds a figure.
    pub fn push(
        &mut self,
        section: &str,
        case: impl Into<String>,
        value: f64,
        unit: &str,
        params: Value,
    ) {
        let params = match params {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        self.figures.push(Figure {
            section: section.to_owned(),
            case: case.into(),
            value,
            unit: unit.to_owned(),
            params,
        });
    }

    /// Adds a note and prints it.
    pub fn note(&mut self, section: &str, text: impl Into<String>) {
        let text = text.into();
        println!("  note ({section}): {text}");
        self.notes.push(Note {
            section: section.to_owned(),
            text,
        });
    }
}
