// `multinorm bench`: throughput benchmarks with same-run baselines.
#include <CLI/CLI.hpp>

#include "multinorm/bench.h"
#include "multinorm/cli.h"
#include "multinorm/model_config.h"

namespace multinorm {

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks, printed as ratios against baselines measured in the same run");
  bench->footer("Example: multinorm bench model --config llama_60m");
  bench->require_subcommand(1);
  auto* model = bench->add_subcommand("model", "Training throughput vs the oneDNN GEMM peak and PyTorch CPU");
  model->footer("Example: multinorm bench model --config llama_1b --batch 32 --seq 256 --predict a100");
  static ModelBenchOptions o;
  model->add_option("--config,-c", o.config, "run config, model config, or a shipped model's name (llama_1b)")
      ->required()
      ->transform(model_config_path);
  model->add_option("--batch", o.batch, "micro-batch (sequences)");
  model->add_option("--seq", o.seq, "sequence length");
  model->add_option("--steps", o.steps, "timed steps");
  model->add_option("--warmup", o.warmup, "untimed steps first");
  model->add_option("--threads", o.threads, "CPU threads (0: all cores)");
  model->add_option("--backend", o.backend, "cpu, cuda or auto");
  model->add_option("--precision", o.precision, "bf16 or fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  model->add_option("--torch", o.torch, "auto: also measure PyTorch (python3-torch); off: skip")->check(CLI::IsMember({"auto", "off"}));
  model->add_flag("--json", o.json, "machine-readable output");
  model->add_option("--predict", o.predict,
                    "a100, h100 or h200: run nothing; print the CUDA kernels' time on that GPU from their bytes and FLOPs (a roofline)")
      ->check(CLI::IsMember({"a100", "h100", "h200"}));
  model->add_option("--peak", o.peak, "with --backend cuda: the GPU (a100, h100, h200) for the MFU and the predicted column")
      ->check(CLI::IsMember({"a100", "h100", "h200"}));
  model->add_option("--gemm-efficiency", o.gemm_efficiency, "roofline: cuBLASLt GEMMs' fraction of the peak FLOP rate (default: the GPU's, docs/cuda.md)")
      ->check(CLI::Range(0.01, 1.0));
  model->add_option("--attention-efficiency", o.attention_efficiency, "roofline: the mma.sync attention kernels' fraction of peak (default: the GPU's)")
      ->check(CLI::Range(0.01, 1.0));
  model->add_option("--ranks", o.ranks, "with --predict: add data parallelism on 1, 2, 4, ... N GPUs, 8 a node (NVLink, InfiniBand)")
      ->check(CLI::Range(1, 512))
      ->needs(model->get_option("--predict"));
  model->callback([] { o.predict.empty() ? bench_model(o) : bench_model_predict(o); });

  auto* optim = bench->add_subcommand("optim", "One optimizer step per optimizer: SinkGD/Adam and SWAN/SinkGD ratios, bandwidth");
  optim->footer("Example: multinorm bench optim --config llama_130m");
  static OptimBenchOptions p;
  optim->add_option("--config,-c", p.config, "run config, model config, or a shipped model's name (llama_1b)")
      ->required()
      ->transform(model_config_path);
  optim->add_option("--precision", p.precision, "bf16 or fp32 weights and states")->check(CLI::IsMember({"bf16", "fp32"}));
  optim->add_option("--steps", p.steps, "timed rounds, optimizers interleaved (the best of each is reported)");
  optim->add_option("--threads", p.threads, "CPU threads (0: all cores)");
  optim->add_option("--backend", p.backend, "cpu, cuda or auto");
  optim->add_flag("--json", p.json, "machine-readable output");
  optim->add_flag("--profile", p.profile, "then one more step of each optimizer with its per-kernel times (a device backend's CUDA events; eager)");
  optim->add_option("--peak", p.peak, "with --profile: each kernel's roofline time on this GPU beside it (a100, h100, h200)")
      ->check(CLI::IsMember({"a100", "h100", "h200"}));
  optim->callback([] { bench_optim(p); });

  auto* gemm = bench->add_subcommand("gemm", "GEMMs alone, a model's as its backend runs them or any shapes, against an n^3 GEMM, TFLOP/s");
  gemm->footer(
      "Each product is also timed with M, N and K rounded up to multiples of 64 (the 'aligned' columns): what padding a width would give.\n"
      "Example: multinorm bench gemm --backend cuda -c llama_1b --shapes 8192x10944x2048:nt");
  static GemmBenchOptions gm;
  gemm->add_option("--config,-c", gm.config, "a model config or a shipped model's name: its training GEMMs")->transform(model_config_path);
  gemm->add_option("--batch", gm.batch, "with -c: the micro-batch's sequences");
  gemm->add_option("--seq", gm.seq, "with -c: the sequence length");
  gemm->add_option("--shapes", gm.shapes, "MxNxK or MxNxK:OPS (OPS: op(a) op(b), each n or t; default nn), comma-separated or repeated")
      ->delimiter(',');
  gemm->add_option("--reference", gm.reference, "the square reference GEMM's size (n x n x n, b transposed)");
  gemm->add_option("--steps", gm.steps, "timed calls of each, at least");
  gemm->add_option("--warmup-ms", gm.warmup_ms, "untimed calls of each first, at least this many milliseconds");
  gemm->add_option("--min-ms", gm.min_ms, "each timed window at least this many milliseconds");
  gemm->add_option("--threads", gm.threads, "CPU threads (0: all cores)");
  gemm->add_option("--backend", gm.backend, "cpu, cuda or auto");
  gemm->add_option("--precision", gm.precision, "bf16 or fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  gemm->add_flag("--json", gm.json, "machine-readable output: a JSON line for the reference, each product and the total");
  gemm->callback([] { bench_gemm(gm); });

  auto* checksum = bench->add_subcommand("checksum", "CRC-32C of checkpoint bytes (GB/s), against a copy of the same bytes");
  checksum->footer("Example: multinorm bench checksum");
  static double checksum_bytes = 2.0 * 1339000000;  // llama_1b's BF16 weights
  checksum->add_option("--bytes", checksum_bytes, "bytes to checksum (default: llama_1b's BF16 weights, 2.68e9)");
  checksum->callback([] { bench_checksum(static_cast<int64_t>(checksum_bytes)); });

  auto* data = bench->add_subcommand("data", "Tokenize throughput vs spm_encode, loader throughput");
  data->footer("Example: multinorm bench data --input 'c4/en/c4-train.00000-of-01024.json.gz' --tokenizer data/c4/t5_spiece.model");
  static DataBenchOptions d;
  data->add_option("--input,-i", d.inputs, "C4 json.gz globs")->required();
  data->add_option("--tokenizer,-t", d.tokenizer, "SentencePiece model")->required();
  data->add_option("--train-tokens-per-s", d.train_tokens_per_s, "trainer rate to compare the loader with");
  data->callback([] { bench_data(d); });

  auto* attention = bench->add_subcommand("attention", "The causal attention kernels alone: forward and forward + backward, TFLOP/s");
  attention->footer(
      "FLOPs as FlashAttention counts them: 4 x B x H x D x T(T+1)/2 forward, 2.5x that backward.\n"
      "Several shapes in one process: --shapes 64x32x256x64,16x32x1024x64 (with --json, a JSON line a shape).\n"
      "Example: multinorm bench attention --backend cuda --batch 16 --heads 32 --seq 1024 --head-dim 64");
  static AttentionBenchOptions at;
  attention->add_option("--batch", at.batch, "sequences");
  attention->add_option("--heads", at.heads, "attention heads");
  attention->add_option("--seq", at.seq, "positions per sequence (T)");
  attention->add_option("--head-dim", at.head_dim, "channels per head (D; the tensor-core kernels take 64 and 128)");
  attention->add_option("--shapes", at.shapes, "BATCHxHEADSxSEQxHEAD_DIM, comma-separated or repeated: every shape in this process "
                                              "(instead of --batch/--heads/--seq/--head-dim)")
      ->delimiter(',');
  attention->add_option("--steps", at.steps, "timed calls of each (forward; forward + backward), at least");
  attention->add_option("--warmup", at.warmup, "untimed forward + backward calls first, at least");
  attention->add_option("--warmup-ms", at.warmup_ms, "... and at least this many milliseconds of them, per shape");
  attention->add_option("--min-ms", at.min_ms, "each timed window at least this many milliseconds (more calls than --steps)");
  attention->add_option("--threads", at.threads, "CPU threads (0: all cores)");
  attention->add_option("--backend", at.backend, "cpu, cuda or auto");
  attention->add_option("--precision", at.precision, "bf16 or fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  attention->add_flag("--json", at.json, "machine-readable output");
  attention->callback([] { bench_attention(at); });
}

}  // namespace multinorm
