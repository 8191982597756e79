// `multinorm devices`: what the CUDA plugin sees, and which backend `auto` picks.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "multinorm/cli.h"
#include "multinorm/device.h"

namespace multinorm {

void add_devices_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("devices", "Show the CUDA plugin, the GPUs it sees and the backend auto picks");
  cmd->footer("Example: multinorm devices");
  cmd->callback([] {
    const CudaProbe& p = probe_cuda();
    if (p.plugin_loaded) {
      std::printf("CUDA plugin: %s (CUDA runtime %d.%d)\n", p.plugin_path.c_str(), p.runtime_version / 1000,
                  (p.runtime_version % 1000) / 10);
      for (const CudaLibrary& l : p.libraries.libraries)
        std::printf("  %s: %s\n", l.soname.c_str(), l.path.empty() ? "not found" : (l.path + (l.found_by == "loader" ? "" : " (found in " + l.found_by + ")")).c_str());
      if (!p.device_error.empty()) std::printf("GPUs: none (%s)\n", p.device_error.c_str());
      else std::printf("GPUs: %d\n", p.device_count);
      for (size_t i = 0; i < p.devices.size(); ++i) {
        const auto& d = p.devices[i];
        std::printf("  [%zu] %s, sm_%d%d, %.1f GiB, %d SMs\n", i, d.name, d.cc_major, d.cc_minor,
                    static_cast<double>(d.total_memory_bytes) / 1073741824.0, d.multiprocessors);
      }
    } else {
      std::printf("CUDA plugin: not loaded (%s)\n", p.load_error.c_str());
    }
    std::printf("backend auto -> %s\n", choose_backend("auto").reason.c_str());
  });
}

}  // namespace multinorm
