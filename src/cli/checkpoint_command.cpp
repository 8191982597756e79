// `multinorm checkpoint verify`: every file of a checkpoint (or of every checkpoint of a run) read and
// checked against its manifest.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>

#include "multinorm/checkpoint.h"
#include "multinorm/cli.h"
#include "multinorm/error.h"
#include "multinorm/trainer.h"

namespace multinorm {

void add_checkpoint_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("checkpoint", "Checkpoint tools");
  cmd->footer("Example: multinorm checkpoint verify runs/c4_llama_60m_sinkgd");
  cmd->require_subcommand(1);
  auto* verify = cmd->add_subcommand("verify", "Check every file of a checkpoint against its manifest (size and CRC-32C)");
  static std::string dir;
  verify->add_option("dir", dir, "a checkpoint directory (runs/NAME/checkpoints/step_N), or a run directory: all its checkpoints")
      ->required();
  verify->footer("Example: multinorm checkpoint verify runs/c4_llama_60m_sinkgd/checkpoints/step_00010000");
  verify->callback([] {
    std::vector<std::string> dirs = {checkpoint_to_read(dir, "checkpoint verify")};  // one, or a run's newest
    if (dirs[0] != dir) {  // a run directory: all its checkpoints
      dirs.clear();
      for (const std::string& d : checkpoint_dirs(dir + "/checkpoints")) dirs.push_back(dir + "/checkpoints/" + d);
    }
    int damaged = 0;
    for (const std::string& d : dirs) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        uint64_t bytes = 0;
        for (const CheckedFile& f : verify_checkpoint(d)) bytes += f.bytes;
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("%s: ok (%.1f MB in %.2f s, %.2f GB/s)\n", d.c_str(), bytes / 1e6, s, bytes / 1e9 / std::max(s, 1e-9));
      } catch (const CorruptFileError& e) {
        std::printf("%s: DAMAGED: %s\n", d.c_str(), e.what());
        ++damaged;
      }
    }
    if (damaged) throw Error(std::to_string(damaged) + " of " + std::to_string(dirs.size()) + " checkpoint(s) damaged");
  });
}

}  // namespace multinorm
