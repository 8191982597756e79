#!/usr/bin/env bash
# The include layering docs/architecture.md draws, checked on every CI run: each source folder and
# each public header (include/multinorm/) belongs to one layer, and a file includes only its own
# layer and those below it. The backends' implementations (kernels/cpu, kernels/cuda) sit above
# everything but the tools and the CLI: they implement the backend seam, and nothing else may reach
# into them (the model, the optimizer and the trainer see only include/multinorm/backend.h).
# A file's own folder's private headers (#include "x.h") are not checked; every other project
# include is, by where it lands. An include of a header the table does not place is an error too.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

# layer: the folders of that layer, then its public headers (include/multinorm/<name>.h)
layers=(
  "0 base | error dtype schema json_file checksum fault_points process_memory stop_signals run_lock safetensors install_paths cuda_plugin_abi cuda_libraries cuda_scratch update_scalars write_back work_queue comm communicator"
  "1 data data_tools src/data | shard tokenizer hf_tokenizer c4_reader data_tools batch loader"
  "2 config src/config | config_choices model_config run_config"
  "3 seam kernels/common | optimizer_kernels backend activation_plan graph_cache"
  "4 runtime src/runtime | device"
  "5 model src/model | model_spec param_store linear llama_model model_io"
  "6 optim src/optim | param_groups schedule shard_plan optimizer memory_estimate"
  "7 parallel src/parallel | data_parallel"
  "8 train src/train | trainer update_pipeline checkpoint divergence"
  "9 experiments src/experiments | sweep compare paper_figures"
  "10 backends kernels/cpu kernels/cuda kernels/cuda/emulation |"
  "11 tools src/bench src/doctor | bench kernel_costs scaling_model doctor"
  "12 cli src/cli | cli"
)
declare -A folder_layer header_layer layer_name
for entry in "${layers[@]}"; do
  read -r -a words <<< "${entry//|/ | }"
  n=${words[0]} layer_name[${words[0]}]=${words[1]} side=folders
  for w in "${words[@]:2}"; do
    if [ "$w" = "|" ]; then side=headers; continue; fi
    if [ $side = folders ]; then folder_layer[$w]=$n; else header_layer[$w]=$n; fi
  done
done

fail=0
complain() { echo "lint_layers: $1"; fail=1; }
# The layer of a file by its path (a public header by its name, anything else by its folder).
layer_of() {
  local path=$1
  case $path in
    include/multinorm/*.h)
      local name; name=$(basename "$path" .h)
      echo "${header_layer[$name]:-}" ;;
    *) echo "${folder_layer[$(dirname "$path")]:-}" ;;
  esac
}
files=$(ls include/multinorm/*.h src/*/*.cpp src/*/*.h kernels/*/*.h kernels/*/*.cuh kernels/*/*.cpp kernels/*/*.cu \
  kernels/cuda/emulation/*.cpp kernels/cuda/emulation/*.h data_tools/*.cpp data_tools/*.h 2>/dev/null)
for f in $files; do
  mine=$(layer_of "$f")
  if [ -z "$mine" ]; then complain "$f: in no layer (add it to tests/lint_layers.sh's table)"; continue; fi
  while IFS= read -r inc; do
    [ -z "$inc" ] && continue
    case $inc in
      multinorm/*) target="include/$inc" ;;
      */*) target=$(realpath -m --relative-to=. "$(dirname "$f")/$inc") ;;
      *) continue ;;  # the folder's own private header
    esac
    [ -e "$target" ] || continue  # generated (tensorboard_event.pb.h) or a system header
    theirs=$(layer_of "$target")
    if [ -z "$theirs" ]; then complain "$f includes $inc, which is in no layer"; continue; fi
    if [ "$theirs" -gt "$mine" ]; then
      complain "$f (${layer_name[$mine]}) includes $inc (${layer_name[$theirs]}): an include upward"
    fi
  done < <(grep -hoE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]+"' "$f" | sed -E 's/.*"([^"]+)".*/\1/')
done
[ $fail = 0 ] && echo "lint_layers: $(echo "$files" | wc -w) files, every include at or below its layer"
exit $fail
