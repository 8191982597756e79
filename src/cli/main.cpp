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
#include "multinorm/fault_points.h"
#include "multinorm/stop_signals.h"
#include "multinorm/trainer.h"

// Under scripts/mpirun_graceful.sh (MULTINORM_STATUS_FILE set) every rank exits 0 and leaves its
// status in that file: the launcher tells mpirun to give its ranks a grace before it kills them, and
// mpirun would wait out that grace after any non-zero exit. The launcher exits with the first
// non-zero status in the file.
static const char* status_file() {
  const char* path = std::getenv("MULTINORM_STATUS_FILE");
  return path && *path ? path : nullptr;
}
static int exit_status(int status) {
  if (!status_file()) return status;
  std::FILE* f = std::fopen(status_file(), "a");
  if (!f) return status;  // the file cannot be written: the status as it is
  std::fprintf(f, "%d\n", status);
  return std::fclose(f) == 0 ? 0 : status;
}

// An error on one rank of a data-parallel run ends them all: the others would wait in a collective.
static int stop_all_ranks(int code) {
  if (multinorm::Comm::several_ranks()) {
    exit_status(code);
    std::fflush(stderr);
    multinorm::Comm::world().abort_all(code);
  }
  return code;
}

// Sentinel defaults ("-1": taken from the run config; "[]": none) hidden from --help, where the
// option's description says what it defaults to; and flags' (`--no-word-cache{false}` says nothing).
static void hide_sentinel_defaults(CLI::App& app) {
  for (CLI::Option* o : app.get_options())
    if (o->get_default_str() == "-1" || o->get_default_str() == "[]" || o->get_expected_max() == 0) o->default_str("");
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) hide_sentinel_defaults(*sub);
}

// Every subcommand's action replaced by nothing (parse-only mode).
static void drop_callbacks(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    sub->callback(std::function<void()>());
    drop_callbacks(*sub);
  }
}

static int run(int argc, char** argv) {
  CLI::App app{"multinorm " MULTINORM_VERSION
               ": LLaMA pretraining with stateless multi-normalized optimizers (SinkGD, SWAN) and Adam"};
  app.set_version_flag("--version", "multinorm " MULTINORM_VERSION);
  app.footer("multinorm SUBCOMMAND --help: the options of each.\nExample: multinorm train --config configs/c4/llama_60m_sinkgd.json");
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // --help shows every option's default (subcommands inherit it)
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
  hide_sentinel_defaults(app);
  // MULTINORM_PARSE_ONLY=1: check the command line (subcommand, flags, values) and exit without
  // running it; the docs test passes every documented command through this.
  if (const char* p = std::getenv("MULTINORM_PARSE_ONLY"); p && std::string(p) == "1") drop_callbacks(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a command that ran and reports a failure (doctor: a check failed)
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the help, the version or what is wrong with the command line
    return code == 0 ? 0 : 2;      // a usage error: status 2, as Unix tools have it
  } catch (const multinorm::StoppedBySignal& e) {  // every rank stops after the same update: no abort
    multinorm::Comm& world = multinorm::Comm::world();
    if (world.root()) std::fprintf(stderr, "multinorm: %s\n", e.what());
    std::fflush(stderr);
    // Every rank is here with its checkpoint written. Under plain mpirun the first to exit 75 makes
    // mpirun end the others, which then leave with their own status, silently (Comm::exiting_with).
    try {
      world.barrier();
    } catch (const std::exception& b) {  // a rank gone after the checkpoint's own barrier: its files are whole
      std::fprintf(stderr, "multinorm: %s\n", b.what());
    }
    multinorm::Comm::exiting_with(status_file() ? 0 : multinorm::kStoppedBySignalStatus);
    multinorm::fault_point("stopped-exit");
    return multinorm::kStoppedBySignalStatus;
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

int main(int argc, char** argv) { return exit_status(run(argc, argv)); }
