// Schema-driven validation of JSON configs. See include/multinorm/schema.h.
#include "multinorm/schema.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "multinorm/error.h"

namespace multinorm {

namespace {

const char* kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::Integer: return "integer";
    case ValueKind::Number: return "number";
    case ValueKind::Boolean: return "boolean";
    case ValueKind::String: return "string";
    case ValueKind::Enum: return "one of";
    case ValueKind::StringList: return "list of strings";
    case ValueKind::Any: return "any";
    case ValueKind::ModelRef: return "model config path or object";
  }
  return "?";
}

std::string json_type_name(const json& v) {
  if (v.is_number_integer()) return "integer " + v.dump();
  if (v.is_number()) return "number " + v.dump();
  if (v.is_boolean()) return std::string("boolean ") + (v.get<bool>() ? "true" : "false");
  if (v.is_string()) return "string " + v.dump();
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

std::string join_choices(const std::vector<std::string>& c) {
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) out += (i ? ", " : "") + c[i];
  return out;
}

std::string format_bound(double v) {
  if (v == std::floor(v) && std::fabs(v) <= 9.007199254740992e15) return std::to_string(static_cast<int64_t>(v));  // 2^53, not 9.007e+15
  std::ostringstream s;
  s.precision(15);
  s << v;
  return s.str();
}

std::string range_text(const SchemaKey& k) {
  const bool lo = std::isfinite(k.min), hi = std::isfinite(k.max);
  if (lo && hi)
    return std::string(k.min_exclusive ? "(" : "[") + format_bound(k.min) + ", " + format_bound(k.max) +
           (k.max_exclusive ? ")" : "]");
  if (lo) return std::string(k.min_exclusive ? "> " : ">= ") + format_bound(k.min);
  if (hi) return std::string(k.max_exclusive ? "< " : "<= ") + format_bound(k.max);
  return "";
}

std::string last_segment(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace keys {
static SchemaKey base(std::string path, ValueKind kind, json def, std::string doc) {
  SchemaKey k;
  k.path = std::move(path);
  k.kind = kind;
  k.default_value = std::move(def);
  k.doc = std::move(doc);
  return k;
}
SchemaKey required(std::string path, ValueKind kind, std::string doc, double min, double max) {
  SchemaKey k = base(std::move(path), kind, nullptr, std::move(doc));
  k.min = min;
  k.max = max;
  k.required = true;
  return k;
}
SchemaKey integer(std::string path, json def, std::string doc, double min, double max) {
  SchemaKey k = base(std::move(path), ValueKind::Integer, std::move(def), std::move(doc));
  k.min = min;
  k.max = max;
  return k;
}
SchemaKey number(std::string path, json def, std::string doc, double min, double max) {
  SchemaKey k = base(std::move(path), ValueKind::Number, std::move(def), std::move(doc));
  k.min = min;
  k.max = max;
  return k;
}
SchemaKey below(std::string path, json def, std::string doc, double min, double max) {
  SchemaKey k = number(std::move(path), std::move(def), std::move(doc), min, max);
  k.max_exclusive = true;
  return k;
}

SchemaKey positive(std::string path, json def, std::string doc, double max) {
  SchemaKey k = number(std::move(path), std::move(def), std::move(doc), 0.0, max);
  k.min_exclusive = true;
  return k;
}
SchemaKey boolean(std::string path, bool def, std::string doc) {
  return base(std::move(path), ValueKind::Boolean, def, std::move(doc));
}
SchemaKey string(std::string path, std::string def, std::string doc) {
  return base(std::move(path), ValueKind::String, std::move(def), std::move(doc));
}
SchemaKey choice(std::string path, std::string def, std::vector<std::string> choices, std::string doc) {
  SchemaKey k = base(std::move(path), ValueKind::Enum, std::move(def), std::move(doc));
  k.choices = std::move(choices);
  return k;
}
SchemaKey list(std::string path, json def, std::string doc) {
  return base(std::move(path), ValueKind::StringList, std::move(def), std::move(doc));
}
SchemaKey info(std::string path, std::string doc) {
  SchemaKey k = base(std::move(path), ValueKind::Any, nullptr, std::move(doc));
  k.nullable = true;
  return k;
}
}  // namespace keys

Schema::Schema(std::string name, std::vector<SchemaKey> keys) : name_(std::move(name)), keys_(std::move(keys)) {}

const SchemaKey* Schema::find(const std::string& path) const {
  for (const auto& k : keys_)
    if (k.path == path) return &k;
  return nullptr;
}

bool Schema::is_section(const std::string& prefix) const {
  for (const auto& k : keys_)
    if (k.path.size() > prefix.size() && k.path.compare(0, prefix.size(), prefix) == 0 && k.path[prefix.size()] == '.')
      return true;
  return false;
}

std::string Schema::suggest(const std::string& unknown) const {
  // Candidates: every key and every section path. Compare whole paths, and also the last segment
  // alone, so that a key put in the wrong section ("lr" at the top) still finds "optimizer.lr".
  std::set<std::string> candidates;
  for (const auto& k : keys_) {
    std::string p = k.path;
    candidates.insert(p);
    for (auto dot = p.rfind('.'); dot != std::string::npos; dot = p.rfind('.')) {
      p = p.substr(0, dot);
      candidates.insert(p);
    }
  }
  const std::string tail = last_segment(unknown);
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    const size_t d_full = edit_distance(unknown, c);
    const size_t d_tail = edit_distance(tail, last_segment(c)) + (c == unknown ? 0 : 1);
    const size_t d = std::min(d_full, d_tail);
    if (d < best_d || (d == best_d && c.size() < best.size())) {
      best_d = d;
      best = c;
    }
  }
  const size_t limit = std::max<size_t>(2, tail.size() / 3);
  return best_d <= limit ? best : "";
}

void Schema::check_value(const SchemaKey& key, const json& v, const std::string& where) const {
  auto fail = [&](const std::string& expected) {
    throw ConfigError(where + ": expected " + expected + ", got " + json_type_name(v));
  };
  if (v.is_null()) {
    if (key.nullable || (key.default_value.is_null() && !key.required)) return;
    fail(std::string(kind_name(key.kind)) + (key.kind == ValueKind::Enum ? " " + join_choices(key.choices) : ""));
  }
  switch (key.kind) {
    case ValueKind::Integer: {
      if (!v.is_number()) fail("an integer" + (range_text(key).empty() ? "" : " " + range_text(key)));
      const double d = v.get<double>();
      if (!v.is_number_integer() && (std::floor(d) != d || std::fabs(d) > 9.007199254740992e15))
        fail("an integer");
      break;
    }
    case ValueKind::Number:
      if (!v.is_number()) fail("a number" + (range_text(key).empty() ? "" : " " + range_text(key)));
      break;
    case ValueKind::Boolean:
      if (!v.is_boolean()) fail("true or false");
      return;
    case ValueKind::String:
      if (!v.is_string()) fail("a string");
      return;
    case ValueKind::Enum:
      if (!v.is_string() || std::find(key.choices.begin(), key.choices.end(), v.get<std::string>()) == key.choices.end()) {
        std::string msg = "one of " + join_choices(key.choices);
        if (v.is_string()) {
          std::string best;
          size_t bd = 3;
          for (const auto& c : key.choices) {
            const size_t d = edit_distance(v.get<std::string>(), c);
            if (d < bd) bd = d, best = c;
          }
          if (!best.empty()) msg += " (did you mean '" + best + "'?)";
        }
        fail(msg);
      }
      return;
    case ValueKind::StringList:
      if (!v.is_array()) fail("a list of strings");
      for (const auto& e : v)
        if (!e.is_string()) fail("a list of strings");
      return;
    case ValueKind::Any:
      return;
    case ValueKind::ModelRef:
      if (!v.is_string() && !v.is_object()) fail("a model config path (string) or an inline model config (object)");
      return;
  }
  // Numeric range checks.
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail("a finite number");
  const bool below = key.min_exclusive ? !(d > key.min) : d < key.min;
  const bool above = key.max_exclusive ? !(d < key.max) : d > key.max;
  if (below || above) fail(std::string(kind_name(key.kind)) + " " + range_text(key));
}

void Schema::walk(const json& node, const std::string& prefix, const std::string& source) const {
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (const SchemaKey* key = find(path)) {
      check_value(*key, it.value(), source + ": " + path);
    } else if (is_section(path)) {
      if (!it.value().is_object())
        throw ConfigError(source + ": " + path + ": expected a section (object), got " + json_type_name(it.value()));
      walk(it.value(), path, source);
    } else {
      const std::string s = suggest(path);
      throw ConfigError(source + ": " + path + ": unknown key" +
                        (s.empty() ? "" : " (did you mean '" + s + "'?)") +
                        "; `multinorm config --reference` lists the valid keys (docs/configs.md)");
    }
  }
}

static const json* lookup(const json& doc, const std::string& path) {
  const json* node = &doc;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string seg = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) return nullptr;
    auto it = node->find(seg);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

static json& lookup_or_create(json& doc, const std::string& path) {
  json* node = &doc;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string seg = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) *node = json::object();
    node = &(*node)[seg];
    if (dot == std::string::npos) return *node;
    start = dot + 1;
  }
}

json Schema::resolve(const json& doc, const std::string& source) const {
  if (!doc.is_object()) throw ConfigError(source + ": expected a JSON object at the top level");
  walk(doc, "", source);
  json out = json::object();
  for (const auto& k : keys_) {
    const json* v = lookup(doc, k.path);
    if (v) {
      lookup_or_create(out, k.path) = *v;
    } else if (k.required) {
      throw ConfigError(source + ": " + k.path + ": required key is missing (" + k.doc + ")");
    } else {
      lookup_or_create(out, k.path) = k.default_value;
    }
  }
  return out;
}

void Schema::apply_override(json& doc, const std::string& path, const json& value, const std::string& origin) const {
  const SchemaKey* key = find(path);
  if (!key) {
    const std::string s = suggest(path);
    throw ConfigError(origin + ": unknown key '" + path + "'" + (s.empty() ? "" : " (did you mean '" + s + "'?)"));
  }
  json v = value;
  // A bare word given to a string-valued key was parsed as a string already; a number given to a
  // string key (e.g. output_dir=123) is taken as its text.
  if ((key->kind == ValueKind::String || key->kind == ValueKind::Enum || key->kind == ValueKind::ModelRef) &&
      v.is_number())
    v = v.dump();
  check_value(*key, v, origin);
  lookup_or_create(doc, path) = v;
}

std::pair<std::string, json> parse_override(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set " + text + ": expected key=value, e.g. --set optimizer.lr=0.01");
  const std::string key = text.substr(0, eq), raw = text.substr(eq + 1);
  json value = json::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = raw;
  return {key, value};
}

std::string Schema::markdown() const {
  std::ostringstream out;
  std::string section = "\x01";
  for (const auto& k : keys_) {
    const auto dot = k.path.find('.');
    const std::string sec = dot == std::string::npos ? "" : k.path.substr(0, dot);
    if (sec != section) {
      section = sec;
      out << "\n### " << (sec.empty() ? "top level" : "`" + sec + "`") << "\n\n"
          << "| key | type | default | meaning |\n|---|---|---|---|\n";
    }
    std::string type = kind_name(k.kind);
    if (k.kind == ValueKind::Enum) type = "`" + join_choices(k.choices) + "`";
    const std::string range = range_text(k);
    if (!range.empty()) type += " " + range;
    std::string def = k.required ? "required" : (k.default_value.is_null() ? "unset" : "`" + k.default_value.dump() + "`");
    out << "| `" << k.path << "` | " << type << " | " << def << " | " << k.doc << " |\n";
  }
  return out.str();
}

}  // namespace multinorm
