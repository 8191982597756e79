// `multinorm export`: write a model in Hugging Face form (model.safetensors + config.json), from a
// fresh seeded init or from another HF-format directory (e.g. to change its dtype). Checkpoints
// become a source once the trainer writes them.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "multinorm/device.h"
#include "multinorm/checkpoint.h"
#include "multinorm/cli.h"
#include "multinorm/json_file.h"
#include "multinorm/model_io.h"
#include "multinorm/run_config.h"
#include "multinorm/trainer.h"

namespace multinorm {

void add_export_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("export", "Write model.safetensors + config.json (Hugging Face LlamaForCausalLM)");
  cmd->footer("Example: multinorm export --config runs/c4_llama_60m_sinkgd/config.json --from runs/c4_llama_60m_sinkgd --out hf/llama_60m_sinkgd");
  static std::string config, from, out, dtype = "bf16";
  static int64_t seed = -1;
  cmd->add_option("--config,-c", config, "run config (its model and seed), model config, or a shipped model's name (llama_1b)")
      ->required()
      ->transform(model_config_path);
  cmd->add_option("--from", from,
                  "weights to export: a checkpoint directory, a run directory (its latest checkpoint) or a Hugging Face directory (default: a "
                  "seeded random init)");
  cmd->add_option("--seed", seed, "init seed (default: the run config's seed, else 0)");
  cmd->add_option("--out,-o", out, "output directory")->required();
  cmd->add_option("--dtype", dtype, "bf16 or fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  cmd->callback([] {
    const json doc = read_json_file(config);
    ModelConfig model_cfg;
    int64_t run_seed = 0;
    BackendRequest backend = BackendRequest::Auto;  // the run's backend when the config is a run config
    if (is_model_config(doc)) {
      model_cfg = load_model_config(config);
    } else {
      const RunConfig run = load_run_config(config);
      model_cfg = run.model;
      run_seed = run.seed;
      backend = run.backend;
    }
    auto be = make_backend(choose_backend(backend), 0);
    LlamaModel model(*be, model_cfg, DType::F32, 1, 2);
    if (from.empty()) model.init_random(static_cast<uint64_t>(seed >= 0 ? seed : run_seed));
    else {
      from = checkpoint_to_read(from, "--from");  // a run directory: its newest
      const auto verify = verify_reads_of(from);  // a checkpoint: its files checked as they are read
      load_hf_model(model, from);
    }
    save_hf_model(model, out, parse_dtype(dtype));
    std::printf("wrote %s/model.safetensors (%lld parameters, %s) and %s/config.json\n", out.c_str(),
                (long long)model.num_params(), dtype.c_str(), out.c_str());
  });
}

}  // namespace multinorm
