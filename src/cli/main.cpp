// multinorm: LLaMA pretraining with gradient multi-normalization (SinkGD, SWAN) and Adam.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <exception>

#include "multinorm/cli.h"
#include "multinorm/comm.h"
#include "multinorm/divergence.h"
#include "multinorm/error.h"

// An error on one rank of a data-parallel run ends them all: the others would wait in a collective.
static int stop_all_ranks(int code) {
  if (multinorm::Comm::several_ranks()) {
    std::fflush(stderr);
    multinorm::Comm::world().abort_all(code);
  }
  return code;
}

// Every subcommand's action replaced by nothing (parse-only mode).
static void drop_callbacks(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    sub->callback(std::function<void()>());
    drop_callbacks(*sub);
  }
}

int main(int argc, char** argv) {
  CLI::App app{"multinorm " MULTINORM_VERSION
               ": LLaMA pretraining with stateless multi-normalized optimizers (SinkGD, SWAN) and Adam"};
  app.set_version_flag("--version", "multinorm " MULTINORM_VERSION);
  app.footer("multinorm SUBCOMMAND --help: the options of each.\nExample: multinorm train --config configs/c4/llama_60m_sinkgd.json");
  app.require_subcommand(1);
  multinorm::add_train_command(app);
  multinorm::add_sweep_command(app);
  multinorm::add_compare_command(app);
  multinorm::add_generate_command(app);
  multinorm::add_info_command(app);
  multinorm::add_config_command(app);
  multinorm::add_devices_command(app);
  multinorm::add_doctor_command(app);
  multinorm::add_checkpoint_command(app);
  multinorm::add_data_command(app);
  multinorm::add_export_command(app);
  multinorm::add_bench_command(app);
  // MULTINORM_PARSE_ONLY=1: check the command line (subcommand, flags, values) and exit without
  // running it; the docs test passes every documented command through this.
  if (const char* p = std::getenv("MULTINORM_PARSE_ONLY"); p && std::string(p) == "1") drop_callbacks(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const multinorm::DivergenceError& e) {  // a run stopped by the divergence monitor: status 3
    std::fprintf(stderr, "multinorm: diverged: %s\n", e.what());
    return stop_all_ranks(3);
  } catch (const multinorm::Error& e) {
    std::fprintf(stderr, "multinorm: error: %s\n", e.what());
    return stop_all_ranks(2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "multinorm: internal error: %s\n", e.what());
    return stop_all_ranks(1);
  }
  return 0;
}
