//! What both harnesses' `compute` share (tests/burn for Burn 0.22, tests/burn-0.21 for 0.21): the ops a
//! model runs on a quantized weight, the inputs they run on, and the verdict lines they print. Each
//! harness runs the ops with its own release's tensor API.
//!
//! One JSON line per 2-D quantized tensor and op: `{"name", "op", "ok", "error" | "max_abs", "max_ref"}`,
//! where `max_abs` is the largest difference between the op on the quantized tensor and on its
//! `dequantize()`, and `max_ref` the largest value of the latter; qcli's side (bench/burn_sweep.py) holds
//! them to its tolerance.

use crate::report;

/// The ops a model runs on a weight `[rows, cols]`, by the name the verdicts use.
pub const OPS: [&str; 4] = ["embedding", "linear-row", "linear-col", "matmul"];

/// The shape of the token ids `embedding` looks up: 16 ids as a `[batch, sequence]` batch.
pub const IDS_SHAPE: [usize; 2] = [2, 8];

/// `count` activation values spread over [-1, 1), the same on every backend.
pub fn activation_values(count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| (i * 7919 % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// The token ids (`IDS_SHAPE`, row-major) `embedding` looks up in a table of `rows` rows.
pub fn token_ids(rows: usize) -> Vec<i64> {
    (0..IDS_SHAPE.iter().product::<usize>())
        .map(|i| (i * 37 % rows) as i64)
        .collect()
}

/// The largest difference between `computed` and `reference` (NaN where either has one), and the largest
/// magnitude in `reference`.
pub fn differences(computed: &[f32], reference: &[f32]) -> (f32, f32) {
    let max_abs = computed
        .iter()
        .zip(reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, |m, d| if d.is_nan() { f32::NAN } else { m.max(d) });
    let max_ref = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    (max_abs, max_ref)
}

/// Each op of `OPS` on each of `tensors` (the 2-D quantized ones), compared by `compare` (`differences` of
/// the op on the quantized tensor and on its dequantized copy), one verdict line each on stdout; a panic
/// or error in one does not stop the others.
pub fn verdicts<T: Clone>(
    tensors: Vec<(String, T)>,
    compare: impl Fn(&str, T) -> Result<(f32, f32), String>,
) {
    for (name, data) in tensors {
        for op in OPS {
            let verdict = match report::catching(|| compare(op, data.clone())) {
                Ok((max_abs, max_ref)) => serde_json::json!(
                    {"name": name, "op": op, "ok": true, "max_abs": max_abs, "max_ref": max_ref}),
                Err(message) => {
                    serde_json::json!({"name": name, "op": op, "ok": false, "error": message})
                }
            };
            println!("{verdict}");
        }
    }
}
