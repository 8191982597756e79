// A configuration schema: one table of keys, each with its type, default, allowed range and doc.
// The table drives validation (unknown keys with suggestions, types, ranges), default filling,
// --set overrides and the generated reference docs/configs.md, so they can never disagree.
#pragma once
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace multinorm {

using json = nlohmann::ordered_json;

enum class ValueKind {
  Integer,     // JSON integer (a float with an integral value such as 1e4 is accepted)
  Number,      // JSON number
  Boolean,
  String,
  Enum,        // one string of `choices`
  StringList,  // array of strings
  Any,         // informational key, accepted as is (e.g. HF's "architectures")
  ModelRef,    // path to a model config (string) or an inline model config (object)
};

struct SchemaKey {
  std::string path;  // dotted, e.g. "optimizer.lr"
  ValueKind kind = ValueKind::Any;
  json default_value;  // null: no default (a required key when `required`, else "unset")
  std::string doc;
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
  bool max_exclusive = false;
  std::vector<std::string> choices;  // Enum only
  bool required = false;
  bool nullable = false;  // JSON null accepted (HF configs use it)
};

// Builders for schema tables: one line per key, reading like the documentation it generates.
namespace keys {
constexpr double kNoMax = std::numeric_limits<double>::infinity();
SchemaKey required(std::string path, ValueKind kind, std::string doc, double min = -kNoMax, double max = kNoMax);
SchemaKey integer(std::string path, json def, std::string doc, double min, double max = kNoMax);
SchemaKey number(std::string path, json def, std::string doc, double min, double max = kNoMax);
SchemaKey positive(std::string path, json def, std::string doc, double max = kNoMax);  // > 0
SchemaKey below(std::string path, json def, std::string doc, double min, double max);   // [min, max)
SchemaKey boolean(std::string path, bool def, std::string doc);
SchemaKey string(std::string path, std::string def, std::string doc);
SchemaKey choice(std::string path, std::string def, std::vector<std::string> choices, std::string doc);
SchemaKey list(std::string path, json def, std::string doc);
SchemaKey info(std::string path, std::string doc);  // accepted as is, any type (HF informational)
}  // namespace keys

class Schema {
 public:
  Schema(std::string name, std::vector<SchemaKey> keys);

  const std::string& name() const { return name_; }
  const std::vector<SchemaKey>& keys() const { return keys_; }
  const SchemaKey* find(const std::string& path) const;

  // Validates `doc` (the parsed file; `source` names it in errors) and returns the resolved config:
  // every key of the schema present, defaults filled in, in schema order.
  json resolve(const json& doc, const std::string& source) const;

  // Sets `path` in a raw document to `value` after checking the key exists and the value's type.
  // `origin` names the override in errors (e.g. "--set optimizer.lr=abc").
  void apply_override(json& doc, const std::string& path, const json& value,
                      const std::string& origin) const;

  // Closest known key to an unknown one, or "" when nothing is close.
  std::string suggest(const std::string& unknown_path) const;

  // The reference table for docs/configs.md.
  std::string markdown() const;

 private:
  void check_value(const SchemaKey& key, const json& value, const std::string& where) const;
  void walk(const json& node, const std::string& prefix, const std::string& source) const;
  bool is_section(const std::string& prefix) const;

  std::string name_;
  std::vector<SchemaKey> keys_;
};

// Parses an override "a.b.c=value". The value is read as JSON when it parses (numbers, true/false,
// arrays, quoted strings) and as a plain string otherwise, so `--set optimizer.name=swan` works.
std::pair<std::string, json> parse_override(const std::string& text);

// Edit distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace multinorm
