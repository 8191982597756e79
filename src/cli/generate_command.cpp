// `multinorm generate`: sample a continuation from a checkpoint (temperature, top-k).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "multinorm/device.h"
#include "multinorm/checkpoint.h"
#include "multinorm/cli.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/llama_model.h"
#include "multinorm/shard.h"
#include "multinorm/tokenizer.h"
#include "multinorm/trainer.h"

namespace multinorm {

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Sample text from a checkpoint");
  cmd->footer("Example: multinorm generate --checkpoint runs/quickstart --prompt \"The history of\"");
  static std::string checkpoint, prompt, tokenizer_path;
  static int64_t tokens = 64, top_k = 40, seed = 0;
  static double temperature = 0.8;
  cmd->add_option("--checkpoint", checkpoint, "checkpoint directory or run directory")->required();
  cmd->add_option("--prompt", prompt, "text to continue")->required();
  cmd->add_option("--tokens", tokens, "tokens to generate");
  cmd->add_option("--temperature", temperature, "softmax temperature (0: greedy)");
  cmd->add_option("--top-k", top_k, "sample among the k most likely tokens (0: all)");
  cmd->add_option("--seed", seed, "sampling seed");
  cmd->add_option("--tokenizer", tokenizer_path, "SentencePiece model (default: the run's data.tokenizer)");
  static bool no_cache = false;
  cmd->add_flag("--no-kv-cache", no_cache,
                "recompute the whole context for every token (the reference path; slow) instead of the key/value cache");
  cmd->callback([] {
    const std::string dir = checkpoint_to_read(checkpoint, "--checkpoint");  // a run directory: its newest
    const auto verify = verify_reads_of(dir);  // every file of the checkpoint checked as it is read
    const std::string config = checkpoint_run_config_path(dir);  // the checkpoint's own, self-sufficient
    const RunConfig run = run_config_from_json(read_json_file(config), config);
    const std::string tok_file = tokenizer_path.empty() ? run.data.tokenizer : tokenizer_path;
    const Tokenizer tok(tok_file);
    const int64_t T = run.batch.seq_len, V = run.model.vocab_size;
    auto be = make_backend(choose_backend(run.backend), static_cast<int>(run.threads));
    LlamaModel model(*be, run.model, run.precision.params, 1, T);
    const TrainerState st = read_checkpoint(dir, model.store(), nullptr, run);
    if (st.tokenizer_hash != 0 && file_fingerprint(tok_file) != st.tokenizer_hash)
      throw Error(tok_file + ": not the tokenizer " + dir + " was trained with (its shards record another); pass that one with --tokenizer");
    std::vector<int32_t> ids = tok.encode(prompt);
    if (ids.empty()) ids.push_back(tok.bos_id() >= 0 ? tok.bos_id() : 0);
    std::mt19937_64 gen(static_cast<uint64_t>(seed));
    std::vector<float> logits(V);
    const size_t prompt_len = ids.size();
    // The context is the last T tokens. With the cache, positions cannot shift: when it is full,
    // decoding restarts from the last T/2 tokens.
    auto prefill = [&](size_t from) {
      model.start_decoding();
      for (size_t i = from; i < ids.size(); ++i) model.decode_step(ids[i], logits.data());
    };
    const auto t0 = std::chrono::steady_clock::now();
    if (!no_cache) prefill(ids.size() > static_cast<size_t>(T) ? ids.size() - T : 0);
    const auto t1 = std::chrono::steady_clock::now();
    for (int64_t n = 0; n < tokens; ++n) {
      const float* last = logits.data();
      if (no_cache) {
        const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - T);
        const std::vector<int32_t> ctx(ids.begin() + start, ids.end());
        const int64_t L = static_cast<int64_t>(ctx.size());
        logits.resize(L * V);
        model.logits({ctx.data(), nullptr, nullptr, 1, L}, logits.data());
        last = logits.data() + (L - 1) * V;
      }
      int32_t next = 0;
      if (temperature <= 0) {
        next = static_cast<int32_t>(std::max_element(last, last + V) - last);
      } else {
        std::vector<int32_t> order(V);
        for (int32_t i = 0; i < V; ++i) order[i] = i;
        const int64_t k = top_k > 0 ? std::min(top_k, V) : V;
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) { return last[a] > last[b]; });
        std::vector<double> p(k);
        for (int64_t i = 0; i < k; ++i) p[i] = std::exp((last[order[i]] - last[order[0]]) / temperature);
        std::discrete_distribution<int64_t> pick(p.begin(), p.end());
        next = order[pick(gen)];
      }
      if (next == tok.eos_id()) break;
      ids.push_back(next);
      if (no_cache || n + 1 == tokens) continue;
      if (model.decode_position() == T) prefill(ids.size() - static_cast<size_t>(T / 2));
      else model.decode_step(next, logits.data());
    }
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count(),
                 gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    std::printf("%s\n", tok.decode(std::vector<int32_t>(ids.begin(), ids.end())).c_str());
    const size_t generated = ids.size() - prompt_len;
    std::fprintf(stderr, "(%zu prompt tokens in %.3f s, %zu generated in %.3f s: %.1f tokens/s, %s)\n", prompt_len,
                 prefill_s, generated, gen_s, generated / std::max(gen_s, 1e-9),
                 no_cache ? "no cache: whole context per token" : "key/value cache");
  });
}

}  // namespace multinorm
