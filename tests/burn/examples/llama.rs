//! A whole Llama-architecture language model run in Burn from a qcli model folder: `config.json` (as
//! Hugging Face writes it) and `model.bpk`, whose weights stay quantized (QFloat) in the modules.
//!
//! ```text
//! llama forward  --backend flex|wgpu --ids 1,2,3 [--layout row|col] [--matmul module|direct] MODEL_DIR LOGITS.safetensors
//! llama generate --backend flex|wgpu --ids 1,2,3 --tokens N [--layout row|col] [--matmul module|direct] MODEL_DIR
//! llama time     --backend flex|wgpu [--prompt 128] [--tokens 16] [--layout row|col] [--matmul module|direct] MODEL_DIR
//! ```
//!
//! `forward` writes the logits of every prompt position (`logits`, f32 `[positions, vocab]`); `generate`
//! prints the ids of a greedy continuation (`{"ids": [...]}`), decoded one token at a time with a KV cache;
//! `time` prints one JSON line: load time, resident memory after load and at the peak of a forward, the
//! time to the first token of a prompt and the greedy decode's tokens a second.
//!
//! The tensors keep the names qcli writes for a Hugging Face checkpoint (`model.layers.0.self_attn.q_proj
//! .weight`, ...), which are this module tree's own paths; only the norms' `weight` is Burn's `gamma`, a
//! rename the store does as it loads. A Linear weight written `[out, in]` (PyTorch's orientation, qcli's
//! default) loads with `LinearLayout::Col`, one written `[in, out]` (`transpose = true`) with `Row`: each
//! is told by its shape, and a square one by `--layout` or the others.
//!
//! `--matmul module` (the default) computes each projection with `Linear::forward` and a tied head with
//! `linear`, as Burn's docs show. Burn 0.22.1's `linear` reshapes a quantized weight to the input's rank
//! first (burn-tensor `src/tensor/module.rs`, `weight.unsqueeze::<D>()` for a batch of one), and flex
//! dequantizes and requantizes a block-scaled tensor on every reshape or transpose (burn-flex
//! `src/ops/qtensor.rs`, `block_safe_layout_op`). `--matmul direct` multiplies the flattened activations
//! by the weight as loaded (`[rows, d_input] @ [d_input, d_output]`) and a tied head as `embedding @ hᵀ`,
//! so no quantized weight is reshaped or transposed per call: what is left is the dequantization Burn's
//! default `q_matmul` does per call.

#[path = "../common/cli.rs"]
mod cli;
#[allow(dead_code, unused_imports, unused_macros)] // the example only writes f32 safetensors
#[path = "../common/report.rs"]
mod report;
#[path = "../src/backend.rs"]
mod backend;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::nn::{
    Embedding, EmbeddingConfig, Linear, LinearConfig, LinearLayout, RmsNorm, RmsNormConfig,
    RotaryEncoding, RotaryEncodingConfig,
};
use burn::prelude::*;
use burn::tensor::activation::silu;
use burn::tensor::module::{attention, linear};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::DType;
use burn_store::{BurnpackStore, FloatCastAdapter, ModuleSnapshot, ModuleStore};
use serde_json::{Value, json};

use crate::cli::{Args, Failure};

const USAGE: &str = "usage:
  llama forward  --backend flex|wgpu --ids 1,2,3 [--layout row|col] [--matmul module|direct] MODEL_DIR LOGITS.safetensors
  llama generate --backend flex|wgpu --ids 1,2,3 --tokens N [--layout row|col] [--matmul module|direct] MODEL_DIR
  llama time     --backend flex|wgpu [--prompt 128] [--tokens 16] [--layout row|col] [--matmul module|direct] MODEL_DIR";

/// What the model's shape takes from `config.json`.
struct Config {
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    eps: f64,
    max_positions: usize,
    tied: bool,
    attention_bias: bool,
    mlp_bias: bool,
    rope_theta: f32,
    /// `rope_scaling` (or transformers 5's `rope_parameters`), when it scales.
    rope_scaling: Option<Value>,
}

impl Config {
    fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|err| format!("{}: {err}", path.display()))?;
        let c: Value = serde_json::from_str(&text).map_err(|err| format!("{}: {err}", path.display()))?;
        let count = |key: &str| {
            c[key]
                .as_u64()
                .map(|n| n as usize)
                .ok_or(format!("{}: no count {key}", path.display()))
        };
        if c["model_type"] != "llama" {
            return Err(format!("{}: model_type {} is not llama", path.display(), c["model_type"]));
        }
        if !matches!(c["hidden_act"].as_str(), None | Some("silu")) {
            return Err(format!("{}: hidden_act {} is not silu", path.display(), c["hidden_act"]));
        }
        let (hidden, heads) = (count("hidden_size")?, count("num_attention_heads")?);
        let rope = [&c["rope_scaling"], &c["rope_parameters"]]
            .into_iter()
            .find(|v| v.is_object())
            .cloned();
        let rope_type = rope
            .as_ref()
            .map(|r| r.get("rope_type").or(r.get("type")).cloned().unwrap_or(Value::Null));
        let rope_scaling = match rope_type.as_ref().and_then(Value::as_str) {
            None | Some("default") => None,
            Some("llama3") => rope.clone(),
            Some(other) => {
                return Err(format!(
                    "{}: rope type {other:?} is not supported (none, default or llama3)",
                    path.display()
                ));
            }
        };
        let theta = c["rope_theta"]
            .as_f64()
            .or(rope.as_ref().and_then(|r| r["rope_theta"].as_f64()))
            .unwrap_or(10000.0);
        Ok(Self {
            hidden,
            intermediate: count("intermediate_size")?,
            layers: count("num_hidden_layers")?,
            heads,
            kv_heads: count("num_key_value_heads").unwrap_or(heads),
            head_dim: count("head_dim").unwrap_or(hidden / heads),
            vocab: count("vocab_size")?,
            eps: c["rms_norm_eps"].as_f64().unwrap_or(1e-6),
            max_positions: count("max_position_embeddings")?,
            tied: c["tie_word_embeddings"].as_bool().unwrap_or(false),
            attention_bias: c["attention_bias"].as_bool().unwrap_or(false),
            mlp_bias: c["mlp_bias"].as_bool().unwrap_or(false),
            rope_theta: theta as f32,
            rope_scaling,
        })
    }
}

#[derive(Module, Debug)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
}

#[derive(Module, Debug)]
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

#[derive(Module, Debug)]
struct Layer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

#[derive(Module, Debug)]
struct Decoder {
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
}

/// The module tree whose parameter paths are the checkpoint's tensor names.
#[derive(Module, Debug)]
struct CausalLm {
    model: Decoder,
    /// None where the head is tied to the token embedding.
    lm_head: Option<Linear>,
}

/// Each layer's keys and values so far, `[1, kv_heads, positions, head_dim]`, rotary positions applied.
type Cache = Vec<Option<(Tensor<4>, Tensor<4>)>>;

struct Llama {
    lm: CausalLm,
    rope: RotaryEncoding,
    config: Config,
    direct: bool,
}

/// `x @ weight [+ bias]` for `x` `[1, seq, d_input]`, the weight as loaded (`[d_input, d_output]`).
fn direct(linear: &Linear, x: Tensor<3>) -> Tensor<3> {
    let [b, seq, d_input] = x.dims();
    let y = x.reshape([b * seq, d_input]).matmul(linear.weight.val());
    let y = match &linear.bias {
        Some(bias) => y + bias.val().unsqueeze::<2>(),
        None => y,
    };
    let d_output = y.dims()[1];
    y.reshape([b, seq, d_output])
}

/// The layout of a Linear weight `[d_input → d_output]` stored with `shape`: told by the shape unless it
/// is square, then `square` (from `--layout`, or the layout every other Linear of the file has).
fn layout_of(shape: &[usize], d_input: usize, d_output: usize, square: Option<LinearLayout>, name: &str)
    -> Result<LinearLayout, String> {
    match shape {
        [a, b] if a == b && a == &d_input && b == &d_output => square.ok_or(format!(
            "{name} is square, so its layout cannot be told from its shape: pass --layout row|col"
        )),
        [o, i] if (*o, *i) == (d_output, d_input) => Ok(LinearLayout::Col),
        [i, o] if (*i, *o) == (d_input, d_output) => Ok(LinearLayout::Row),
        _ => Err(format!("{name} is {shape:?}, not [{d_output}, {d_input}] or [{d_input}, {d_output}]")),
    }
}

impl Llama {
    /// The model `config` describes, its Linear layouts read from the file's tensor `shapes`.
    fn shaped(
        config: Config,
        shapes: &BTreeMap<String, Vec<usize>>,
        layout: Option<LinearLayout>,
        device: &Device,
    ) -> Result<Self, String> {
        let c = &config;
        let (q_dim, kv_dim) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let shape = |name: &str| {
            shapes.get(name).cloned().ok_or(format!("model.bpk has no {name}"))
        };
        // (name, d_input, d_output, bias) of every Linear, in module order.
        let mut linears = Vec::new();
        for i in 0..c.layers {
            let p = format!("model.layers.{i}");
            for (name, d_in, d_out, bias) in [
                ("self_attn.q_proj", c.hidden, q_dim, c.attention_bias),
                ("self_attn.k_proj", c.hidden, kv_dim, c.attention_bias),
                ("self_attn.v_proj", c.hidden, kv_dim, c.attention_bias),
                ("self_attn.o_proj", q_dim, c.hidden, c.attention_bias),
                ("mlp.gate_proj", c.hidden, c.intermediate, c.mlp_bias),
                ("mlp.up_proj", c.hidden, c.intermediate, c.mlp_bias),
                ("mlp.down_proj", c.intermediate, c.hidden, c.mlp_bias),
            ] {
                linears.push((format!("{p}.{name}.weight"), d_in, d_out, bias));
            }
        }
        let separate_head = !c.tied && shapes.contains_key("lm_head.weight");
        if separate_head {
            linears.push(("lm_head.weight".into(), c.hidden, c.vocab, false));
        }
        // A square weight's layout: --layout, else the one every non-square weight has.
        let told: Vec<LinearLayout> = linears
            .iter()
            .filter_map(|(name, d_in, d_out, _)| layout_of(&shape(name).ok()?, *d_in, *d_out, None, name).ok())
            .collect();
        let square = layout.or(match told.first() {
            Some(first) if told.iter().all(|l| std::mem::discriminant(l) == std::mem::discriminant(first)) => {
                Some(*first)
            }
            _ => None,
        });
        let mut built = Vec::new();
        for (name, d_in, d_out, bias) in &linears {
            let layout = layout_of(&shape(name)?, *d_in, *d_out, square, name)?;
            built.push(
                LinearConfig::new(*d_in, *d_out)
                    .with_bias(*bias)
                    .with_layout(layout)
                    .init(device),
            );
        }
        let mut built = built.into_iter();
        let mut next = || built.next().expect("one Linear per name");
        let norm = || RmsNormConfig::new(c.hidden).with_epsilon(c.eps).init(device);
        let layers = (0..c.layers)
            .map(|_| Layer {
                input_layernorm: norm(),
                self_attn: Attention { q_proj: next(), k_proj: next(), v_proj: next(), o_proj: next() },
                post_attention_layernorm: norm(),
                mlp: Mlp { gate_proj: next(), up_proj: next(), down_proj: next() },
            })
            .collect();
        let lm = CausalLm {
            model: Decoder {
                embed_tokens: EmbeddingConfig::new(c.vocab, c.hidden).init(device),
                layers,
                norm: norm(),
            },
            lm_head: separate_head.then(next),
        };
        let rope = rotary(c, device)?;
        Ok(Self { lm, rope, config, direct: false })
    }

    /// Loads a model folder's `config.json` and `model.bpk` on `device`.
    fn load(folder: &Path, layout: Option<LinearLayout>, device: &Device) -> Result<Self, String> {
        let config = Config::read(&folder.join("config.json"))?;
        let weights = folder.join("model.bpk");
        // Hugging Face's RMSNorm calls its scale `weight`, Burn's `RmsNorm` calls it `gamma`. Kept float
        // tensors (norms, a float model's weights) load as f32, the activations' dtype: flex's ops panic on
        // an f32 activation times a BF16 norm. Quantized tensors pass the adapter unchanged.
        let store = || {
            BurnpackStore::from_file(&weights)
                .with_remap_pattern(r"norm\.weight$", "norm.gamma")
                .with_from_adapter(FloatCastAdapter::to(DType::F32))
        };
        let shapes = store()
            .get_all_tensors()
            .map_err(|err| format!("{}: {err}", weights.display()))?
            .iter()
            .map(|(name, tensor)| (name.clone(), tensor.shape.to_vec()))
            .collect();
        let mut model = Self::shaped(config, &shapes, layout, device)?;
        model
            .lm
            .load_from(&mut store())
            .map_err(|err| format!("{}: {err}", weights.display()))?;
        Ok(model)
    }

    /// The logits of `ids` (at the positions after those `cache` holds), all positions or the last only;
    /// `cache` grows by `ids`.
    fn forward(&self, ids: &[i64], cache: &mut Cache, all: bool) -> Tensor<3> {
        let c = &self.config;
        let device = self.rope.freq_complex.device();
        let seq = ids.len();
        let start = cache[0].as_ref().map_or(0, |(k, _)| k.dims()[2]);
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids.to_vec(), [1, seq]), &device);
        let mut h = self.lm.model.embed_tokens.forward(ids);
        for (layer, cached) in self.lm.model.layers.iter().zip(cache.iter_mut()) {
            let a = layer.input_layernorm.forward(h.clone());
            let attn = &layer.self_attn;
            let heads = |x: Tensor<3>, n: usize| x.reshape([1, seq, n, c.head_dim]).swap_dims(1, 2);
            let q = self.rotate(heads(self.project(&attn.q_proj, a.clone()), c.heads), start);
            let k = self.rotate(heads(self.project(&attn.k_proj, a.clone()), c.kv_heads), start);
            let v = heads(self.project(&attn.v_proj, a), c.kv_heads);
            let (k, v) = match cached.take() {
                Some((k0, v0)) => (Tensor::cat(vec![k0, k], 2), Tensor::cat(vec![v0, v], 2)),
                None => (k, v),
            };
            *cached = Some((k.clone(), v.clone()));
            // Grouped-query attention: each key/value head serves heads / kv_heads query heads in turn.
            let groups = c.heads / c.kv_heads;
            let repeat = |x: Tensor<4>| {
                let [b, n, s, d] = x.dims();
                x.unsqueeze_dim::<5>(2).repeat_dim(2, groups).reshape([b, n * groups, s, d])
            };
            let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
            let o = attention(q, repeat(k), repeat(v), None, None, options);
            h = h + self.project(&attn.o_proj, o.swap_dims(1, 2).reshape([1, seq, c.heads * c.head_dim]));
            let m = layer.post_attention_layernorm.forward(h.clone());
            let mlp = &layer.mlp;
            let gated = silu(self.project(&mlp.gate_proj, m.clone())) * self.project(&mlp.up_proj, m);
            h = h + self.project(&mlp.down_proj, gated);
        }
        let h = if all { h } else { h.narrow(1, seq - 1, 1) };
        let h = self.lm.model.norm.forward(h);
        let embedding = || self.lm.model.embed_tokens.weight.val();
        match (&self.lm.lm_head, self.direct) {
            (Some(head), _) => self.project(head, h),
            // Tied: the token embedding [vocab, hidden], transposed, is the head's [hidden → vocab] weight.
            (None, false) => linear(h, embedding().transpose(), None),
            (None, true) => {
                let [b, seq, hidden] = h.dims();
                let logits = embedding().matmul(h.reshape([b * seq, hidden]).transpose());
                logits.transpose().unsqueeze::<3>()
            }
        }
    }

    /// One projection of the model, as `--matmul` says.
    fn project(&self, linear: &Linear, x: Tensor<3>) -> Tensor<3> {
        if self.direct { direct(linear, x) } else { linear.forward(x) }
    }

    /// Rotary positions from `start` on `x` `[1, heads, positions, head_dim]`. Hugging Face's Llama rotates
    /// dims (i, i + head_dim/2) together, Burn's `RotaryEncoding` dims (2i, 2i + 1): the dims are reordered
    /// so each of Hugging Face's pairs sits side by side. Queries and keys get the same order, so their dot
    /// products, all attention uses, are unchanged.
    fn rotate(&self, x: Tensor<4>, start: usize) -> Tensor<4> {
        let [b, n, s, d] = x.dims();
        let paired = x.reshape([b, n, s, 2, d / 2]).swap_dims(3, 4).reshape([b, n, s, d]);
        self.rope.apply(paired, start)
    }

    /// `tokens` greedy continuation ids of `prompt`, decoded one at a time with a KV cache.
    fn generate(&self, prompt: &[i64], tokens: usize) -> Result<Vec<i64>, String> {
        if prompt.len() + tokens > self.config.max_positions {
            return Err(format!(
                "{} prompt and {tokens} new tokens exceed max_position_embeddings {}",
                prompt.len(),
                self.config.max_positions
            ));
        }
        let mut cache: Cache = vec![None; self.config.layers];
        let mut ids = Vec::new();
        let mut next = argmax_last(self.forward(prompt, &mut cache, false));
        while ids.len() < tokens {
            ids.push(next);
            if ids.len() < tokens {
                next = argmax_last(self.forward(&[next], &mut cache, false));
            }
        }
        Ok(ids)
    }
}

/// Burn's `RotaryEncoding` with the config's theta, and Llama 3's frequency scaling where it has one
/// (transformers' `_compute_llama3_parameters`: long wavelengths divided by `factor`, short ones kept,
/// those between interpolated).
fn rotary(c: &Config, device: &Device) -> Result<RotaryEncoding, String> {
    let rope = RotaryEncodingConfig::new(c.max_positions, c.head_dim).with_theta(c.rope_theta);
    let Some(s) = &c.rope_scaling else {
        return Ok(rope.init(device));
    };
    let number = |key: &str| s[key].as_f64().ok_or(format!("rope_scaling has no number {key}"));
    let (factor, low, high) = (number("factor")?, number("low_freq_factor")?, number("high_freq_factor")?);
    let context = number("original_max_position_embeddings")?;
    let scale = move |frequencies: Tensor<1>| {
        let device = frequencies.device();
        let values: Vec<f32> = frequencies.into_data().try_to_vec().expect("f32 frequencies");
        let scaled: Vec<f32> = values
            .iter()
            .map(|&f| {
                let f = f as f64;
                let wavelength = 2.0 * std::f64::consts::PI / f;
                let scaled = if wavelength < context / high {
                    f
                } else if wavelength > context / low {
                    f / factor
                } else {
                    let smooth = (context / wavelength - low) / (high - low);
                    (1.0 - smooth) * f / factor + smooth * f
                };
                scaled as f32
            })
            .collect();
        let count = scaled.len();
        Tensor::<1>::from_data(TensorData::new(scaled, [count]), &device)
    };
    Ok(rope.init_with_frequency_scaling(scale, device))
}

/// The id of the largest logit at the last position of `logits` `[1, positions, vocab]`.
fn argmax_last(logits: Tensor<3>) -> i64 {
    let [_, seq, _] = logits.dims();
    logits.narrow(1, seq - 1, 1).argmax(2).into_scalar::<i64>()
}

/// The process's resident memory (`VmRSS`) and its peak (`VmHWM`), in MiB.
fn memory_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn ids(args: &Args) -> Result<Vec<i64>, Failure> {
    let ids: Result<Vec<i64>, _> = args.option("ids")?.split(',').map(|id| id.trim().parse()).collect();
    match ids {
        Ok(ids) if !ids.is_empty() => Ok(ids),
        _ => Err(Failure::Usage("--ids takes token ids separated by commas".into())),
    }
}

fn count(args: &Args, name: &str, default: usize) -> Result<usize, Failure> {
    match args.option(name) {
        Ok(value) => value.parse().map_err(|_| Failure::Usage(format!("--{name} takes a count"))),
        Err(_) => Ok(default),
    }
}

fn run(args: &Args) -> Result<(), Failure> {
    let device = backend::device(args.option("backend")?).map_err(Failure::Usage)?;
    let layout = match args.option("layout") {
        Ok("row") => Some(LinearLayout::Row),
        Ok("col") => Some(LinearLayout::Col),
        Ok(other) => return Err(Failure::Usage(format!("--layout is row or col, not {other:?}"))),
        Err(_) => None,
    };
    let direct = match args.option("matmul") {
        Ok("direct") => true,
        Ok("module") | Err(_) => false,
        Ok(other) => return Err(Failure::Usage(format!("--matmul is module or direct, not {other:?}"))),
    };
    let load = |folder: &Path| -> Result<Llama, String> {
        let mut model = Llama::load(folder, layout, &device)?;
        model.direct = direct;
        Ok(model)
    };
    let started = Instant::now();
    match args.command.as_str() {
        "forward" => {
            let [folder, output]: [&PathBuf; 2] = args.paths()?;
            let model = load(folder)?;
            let prompt = ids(args)?;
            let mut cache: Cache = vec![None; model.config.layers];
            let logits = model.forward(&prompt, &mut cache, true);
            let [_, seq, vocab] = logits.dims();
            let values = logits.into_data().try_to_vec::<f32>().map_err(|err| format!("{err:?}"))?;
            Ok(report::write_f32(output, &[("logits".into(), vec![seq, vocab], values)])?)
        }
        "generate" => {
            let [folder]: [&PathBuf; 1] = args.paths()?;
            let model = load(folder)?;
            let tokens = count(args, "tokens", 32)?;
            println!("{}", json!({"ids": model.generate(&ids(args)?, tokens)?}));
            Ok(())
        }
        "time" => {
            let [folder]: [&PathBuf; 1] = args.paths()?;
            let model = load(folder)?;
            device.sync().map_err(|err| format!("{err:?}"))?;
            let load_s = started.elapsed().as_secs_f64();
            let (rss_load, peak_load) = memory_mib();
            // Writing 5 to clear_refs resets VmHWM, so the next peak is the forward's own.
            let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
            let (positions, tokens) = (count(args, "prompt", 128)?, count(args, "tokens", 16)?);
            let vocab = model.config.vocab as i64;
            let prompt: Vec<i64> = (0..positions as i64).map(|i| (i * 7919 + 13) % vocab).collect();
            let mut cache: Cache = vec![None; model.config.layers];
            let begun = Instant::now();
            let mut next = argmax_last(model.forward(&prompt, &mut cache, false));
            let first_token_s = begun.elapsed().as_secs_f64();
            let (_, peak_forward) = memory_mib();
            let begun = Instant::now();
            for _ in 0..tokens {
                next = argmax_last(model.forward(&[next], &mut cache, false));
            }
            let decode_s = begun.elapsed().as_secs_f64();
            println!(
                "{}",
                json!({
                    "backend": args.option("backend")?, "model": folder.display().to_string(),
                    "matmul": if direct { "direct" } else { "module" },
                    "load_s": load_s, "rss_after_load_mib": rss_load, "peak_load_mib": peak_load,
                    "peak_forward_mib": if reset { peak_forward } else { f64::NAN },
                    "prompt_tokens": positions, "first_token_s": first_token_s,
                    "prompt_tokens_per_s": positions as f64 / first_token_s,
                    "decode_tokens": tokens, "decode_tokens_per_s": tokens as f64 / decode_s,
                })
            );
            Ok(())
        }
        other => Err(Failure::Usage(format!("unknown command {other:?}"))),
    }
}

fn main() -> std::process::ExitCode {
    cli::main(USAGE, run)
}
