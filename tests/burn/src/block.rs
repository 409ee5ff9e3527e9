//! A small Llama-shaped transformer block, loaded from a qcli file with `load_from` and run forward:
//! token embedding, RMS norms, causal multi-head attention (q, k, v, o projections) and a gated MLP
//! (gate, up, down), in that order, with residual connections; no positional encoding.
//!
//! Its tensors are `embed.weight`, `attn_norm.gamma`, `{q,k,v,o}.weight`, `mlp_norm.gamma`,
//! `{gate,up,down}.weight` and `norm.gamma`; a linear weight is `[d_input, d_output]` for Row and
//! `[d_output, d_input]` for Col (PyTorch's orientation).

use std::path::Path;

use burn::nn::{
    Embedding, EmbeddingConfig, Linear, LinearConfig, LinearLayout, RmsNorm, RmsNormConfig,
};
use burn::prelude::*;
use burn::tensor::activation::{silu, softmax};
use burn_store::{BurnpackStore, ModuleSnapshot, ModuleStore};

use crate::tensors;

#[derive(Module, Debug)]
pub struct Block {
    embed: Embedding,
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    mlp_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
    norm: RmsNorm,
}

/// RMS norms' epsilon; torch's side uses the same.
const EPSILON: f64 = 1e-5;

impl Block {
    /// A block shaped after `store`'s `embed.weight` ([vocab, d_model]) and `up.weight` (d_ff).
    fn shaped_like(
        store: &mut BurnpackStore,
        layout: LinearLayout,
        device: &Device,
    ) -> Result<Self, String> {
        let tensors = store.get_all_tensors().map_err(|err| err.to_string())?;
        let dims = |name: &str| {
            tensors
                .get(name)
                .map(|t| t.shape.to_vec())
                .ok_or(format!("the file has no {name}"))
        };
        let [vocab, d_model] = dims("embed.weight")?[..] else {
            return Err("embed.weight is not 2-D".into());
        };
        let up = dims("up.weight")?;
        let d_ff = if up[0] == d_model { up[1] } else { up[0] };
        let linear = |d_input, d_output| {
            LinearConfig::new(d_input, d_output)
                .with_bias(false)
                .with_layout(layout)
                .init(device)
        };
        let norm = || {
            RmsNormConfig::new(d_model)
                .with_epsilon(EPSILON)
                .init(device)
        };
        Ok(Self {
            embed: EmbeddingConfig::new(vocab, d_model).init(device),
            attn_norm: norm(),
            q: linear(d_model, d_model),
            k: linear(d_model, d_model),
            v: linear(d_model, d_model),
            o: linear(d_model, d_model),
            mlp_norm: norm(),
            gate: linear(d_model, d_ff),
            up: linear(d_model, d_ff),
            down: linear(d_ff, d_model),
            norm: norm(),
        })
    }

    fn forward(&self, ids: Tensor<2, Int>, heads: usize) -> Tensor<3> {
        let [batch, seq] = ids.dims();
        let h = self.embed.forward(ids);
        let d_model = h.dims()[2];
        let split = |x: Tensor<3>| {
            x.reshape([batch, seq, heads, d_model / heads])
                .swap_dims(1, 2)
        };
        let a = self.attn_norm.forward(h.clone());
        let (q, k, v) = (
            split(self.q.forward(a.clone())),
            split(self.k.forward(a.clone())),
            split(self.v.forward(a)),
        );
        let scores = q.matmul(k.transpose()) / ((d_model / heads) as f32).sqrt();
        // `tril_mask` is true above the diagonal: the keys after each query.
        let future = Tensor::<4, Bool>::tril_mask([batch, heads, seq, seq], 0, &h.device());
        let attention = softmax(scores.mask_fill(future, f32::NEG_INFINITY), 3).matmul(v);
        let h = h + self
            .o
            .forward(attention.swap_dims(1, 2).reshape([batch, seq, d_model]));
        let m = self.mlp_norm.forward(h.clone());
        let h = h + self
            .down
            .forward(silu(self.gate.forward(m.clone())) * self.up.forward(m));
        self.norm.forward(h)
    }
}

/// Loads `weights` into a block with `load_from`, runs the token ids of `input` (tensor `ids`, f32)
/// through it with `heads` attention heads, and writes the hidden states as `y`.
pub fn forward(
    device: &Device,
    layout: LinearLayout,
    heads: usize,
    weights: &Path,
    input: &Path,
    output: &Path,
) -> Result<(), String> {
    let mut block = Block::shaped_like(&mut BurnpackStore::from_file(weights), layout, device)?;
    block
        .load_from(&mut BurnpackStore::from_file(weights))
        .map_err(|err| format!("{}: {err}", weights.display()))?;
    let (_, ids) = tensors::read_f32(input)?
        .into_iter()
        .find(|(name, _)| name == "ids")
        .ok_or(format!("{} has no tensor ids", input.display()))?;
    let ids = Tensor::<2>::from_data(ids, device).int();
    let y = block.forward(ids, heads);
    let shape = y.dims().to_vec();
    crate::report::write_f32(
        output,
        &[("y".to_string(), shape, tensors::into_f32(y.into_data())?)],
    )
}
