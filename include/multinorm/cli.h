// Subcommands of the multinorm binary. Each add_*_command registers its options and callback on
// the CLI11 app; main() only dispatches.
#pragma once
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace multinorm {

void add_info_command(CLI::App& app);
void add_config_command(CLI::App& app);
void add_devices_command(CLI::App& app);
void add_doctor_command(CLI::App& app);
void add_checkpoint_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_sweep_command(CLI::App& app);
void add_compare_command(CLI::App& app);

// "58,073,600"
std::string with_commas(int64_t n);

// The Markdown reference of every run and model config key (docs/configs.md).
std::string config_reference_markdown();

}  // namespace multinorm
