// A JSON Schema (draft 2020-12) checker for the tests of the border between tally and its workers
// (docs/schemas/). It knows only the keywords those schemas use, and refuses a schema with any
// other, so a schema never passes because a keyword of it was silently skipped:
//   type (a name or a list), properties, patternProperties, additionalProperties (false or a
//   schema), required, maxProperties, items, minItems, maxItems, uniqueItems, enum, const,
//   minimum, exclusiveMinimum, maximum, minLength, maxLength (in characters), pattern
//   (ECMAScript, unanchored), anyOf, $ref ("#/$defs/<name>"); $schema, $id, title, description,
//   $comment and examples are ignored (full_instance takes a string's first example, where a
//   pattern would refuse its "x").
// One difference from the standard, on purpose: "integer" is an integer literal (2.0 is not one),
// as tally's readers take it (io::read_integer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tally::testing {

using SchemaJson = nlohmann::json;

inline SchemaJson load_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return SchemaJson::parse(text.str());
}

namespace detail {

inline bool has_type(const SchemaJson& value, const std::string& type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "number") return value.is_number();
  if (type == "integer") return value.is_number_integer();
  throw std::invalid_argument("schema: unknown type \"" + type + "\"");
}

// Characters of a UTF-8 string: bytes that do not continue a sequence.
inline std::size_t characters(const std::string& text) {
  std::size_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

inline std::string shown(const SchemaJson& value) {
  std::string text = value.dump();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

class Checker {
 public:
  explicit Checker(const SchemaJson& root) : root_(root) {}

  void check(const SchemaJson& schema, const SchemaJson& value, const std::string& at,
             std::vector<std::string>& errors) const {
    if (!schema.is_object()) throw std::invalid_argument("schema at " + at + ": not an object");
    for (const auto& [keyword, argument] : schema.items()) {
      if (keyword == "$schema" || keyword == "$id" || keyword == "title" || keyword == "description" ||
          keyword == "$comment" || keyword == "$defs" || keyword == "examples") {
        continue;
      } else if (keyword == "$ref") {
        check(resolve(argument.get<std::string>()), value, at, errors);
      } else if (keyword == "type") {
        bool any = false;
        if (argument.is_array()) {
          for (const SchemaJson& t : argument) any = any || has_type(value, t.get<std::string>());
        } else {
          any = has_type(value, argument.get<std::string>());
        }
        if (!any) errors.push_back(at + ": expected type " + argument.dump() + ", got " + shown(value));
      } else if (keyword == "enum") {
        bool any = false;
        for (const SchemaJson& option : argument) any = any || option == value;
        if (!any) errors.push_back(at + ": expected one of " + argument.dump() + ", got " + shown(value));
      } else if (keyword == "const") {
        if (argument != value) errors.push_back(at + ": expected " + argument.dump() + ", got " + shown(value));
      } else if (keyword == "minimum") {
        if (value.is_number() && value.get<double>() < argument.get<double>())
          errors.push_back(at + ": " + shown(value) + " is below the minimum " + argument.dump());
      } else if (keyword == "exclusiveMinimum") {
        if (value.is_number() && value.get<double>() <= argument.get<double>())
          errors.push_back(at + ": " + shown(value) + " is not above " + argument.dump());
      } else if (keyword == "maximum") {
        if (value.is_number() && value.get<double>() > argument.get<double>())
          errors.push_back(at + ": " + shown(value) + " is above the maximum " + argument.dump());
      } else if (keyword == "minLength") {
        if (value.is_string() && characters(value.get<std::string>()) < argument.get<std::size_t>())
          errors.push_back(at + ": shorter than " + argument.dump() + " characters");
      } else if (keyword == "maxLength") {
        if (value.is_string() && characters(value.get<std::string>()) > argument.get<std::size_t>())
          errors.push_back(at + ": longer than " + argument.dump() + " characters");
      } else if (keyword == "pattern") {
        if (value.is_string() &&
            !std::regex_search(value.get<std::string>(), std::regex(argument.get<std::string>(), std::regex::ECMAScript)))
          errors.push_back(at + ": " + shown(value) + " does not match " + argument.get<std::string>());
      } else if (keyword == "minItems") {
        if (value.is_array() && value.size() < argument.get<std::size_t>())
          errors.push_back(at + ": fewer than " + argument.dump() + " items");
      } else if (keyword == "maxItems") {
        if (value.is_array() && value.size() > argument.get<std::size_t>())
          errors.push_back(at + ": more than " + argument.dump() + " items");
      } else if (keyword == "uniqueItems") {
        if (value.is_array() && argument.get<bool>()) {
          const std::set<SchemaJson> distinct(value.begin(), value.end());
          if (distinct.size() != value.size()) errors.push_back(at + ": items repeat");
        }
      } else if (keyword == "items") {
        if (value.is_array())
          for (std::size_t i = 0; i < value.size(); ++i)
            check(argument, value[i], at + "/" + std::to_string(i), errors);
      } else if (keyword == "maxProperties") {
        if (value.is_object() && value.size() > argument.get<std::size_t>())
          errors.push_back(at + ": more than " + argument.dump() + " properties");
      } else if (keyword == "required") {
        if (value.is_object())
          for (const SchemaJson& key : argument)
            if (!value.contains(key.get<std::string>()))
              errors.push_back(at + ": the required property \"" + key.get<std::string>() + "\" is missing");
      } else if (keyword == "properties" || keyword == "patternProperties" || keyword == "additionalProperties") {
        if (value.is_object()) check_properties(schema, value, at, errors, keyword);
      } else if (keyword == "anyOf") {
        std::vector<std::string> all;
        bool any = false;
        for (const SchemaJson& option : argument) {
          std::vector<std::string> option_errors;
          check(option, value, at, option_errors);
          if (option_errors.empty()) any = true;
          all.insert(all.end(), option_errors.begin(), option_errors.end());
        }
        if (!any) {
          std::string why;
          for (const std::string& e : all) why += (why.empty() ? "" : "; ") + e;
          errors.push_back(at + ": matches none of anyOf (" + why + ")");
        }
      } else {
        throw std::invalid_argument("schema at " + at + ": the keyword \"" + keyword +
                                    "\" is not one tests/support/json_schema.h knows");
      }
    }
  }

 private:
  const SchemaJson& resolve(const std::string& ref) const {
    const std::string prefix = "#/$defs/";
    if (ref.rfind(prefix, 0) != 0 || !root_.contains("$defs") || !root_["$defs"].contains(ref.substr(prefix.size())))
      throw std::invalid_argument("schema: cannot resolve $ref \"" + ref + "\"");
    return root_["$defs"][ref.substr(prefix.size())];
  }

  // properties, patternProperties and additionalProperties together, once per object (under the
  // keyword that comes first), since additionalProperties depends on the other two.
  void check_properties(const SchemaJson& schema, const SchemaJson& value, const std::string& at,
                        std::vector<std::string>& errors, const std::string& keyword) const {
    for (const char* first : {"properties", "patternProperties", "additionalProperties"})
      if (schema.contains(first)) {
        if (keyword != first) return;
        break;
      }
    for (const auto& [key, item] : value.items()) {
      bool matched = false;
      if (schema.contains("properties") && schema["properties"].contains(key)) {
        matched = true;
        check(schema["properties"][key], item, at + "/" + key, errors);
      }
      if (schema.contains("patternProperties"))
        for (const auto& [pattern, sub] : schema["patternProperties"].items())
          if (std::regex_search(key, std::regex(pattern, std::regex::ECMAScript))) {
            matched = true;
            check(sub, item, at + "/" + key, errors);
          }
      if (matched || !schema.contains("additionalProperties")) continue;
      const SchemaJson& additional = schema["additionalProperties"];
      if (additional.is_boolean()) {
        if (!additional.get<bool>()) errors.push_back(at + ": the property \"" + key + "\" is not allowed");
      } else {
        check(additional, item, at + "/" + key, errors);
      }
    }
  }

  const SchemaJson& root_;
};

}  // namespace detail

// Every way `value` breaks `schema` ("/params/0/shape: fewer than 1 items"); empty: valid.
inline std::vector<std::string> schema_errors(const SchemaJson& schema, const SchemaJson& value) {
  std::vector<std::string> errors;
  detail::Checker(schema).check(schema, value, "", errors);
  return errors;
}

// A document the schema accepts that holds every property each of its objects lists: the first
// enum value, the const, the minimum (or 1) of a number, minLength letters of a string, minItems
// (or one) items of an array, the first alternative of anyOf that is not null. So a reader
// handed it must know every field the schema names.
inline SchemaJson full_instance(const SchemaJson& root, const SchemaJson& schema) {
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"].get<std::string>();
    return full_instance(root, root["$defs"][ref.substr(std::string("#/$defs/").size())]);
  }
  if (schema.contains("const")) return schema["const"];
  if (schema.contains("examples")) return schema["examples"].front();
  if (schema.contains("enum")) return schema["enum"].front();
  if (schema.contains("anyOf")) {
    for (const SchemaJson& option : schema["anyOf"])
      if (!(option.contains("type") && option["type"] == "null")) return full_instance(root, option);
  }
  std::string type = "object";
  if (schema.contains("type")) {
    const SchemaJson& t = schema["type"];
    type = t.is_array() ? t.front().get<std::string>() : t.get<std::string>();
  }
  if (type == "object") {
    SchemaJson out = SchemaJson::object();
    if (schema.contains("properties"))
      for (const auto& [key, sub] : schema["properties"].items()) out[key] = full_instance(root, sub);
    return out;
  }
  if (type == "array") {
    SchemaJson out = SchemaJson::array();
    const std::size_t count = schema.value("minItems", std::size_t{1});
    for (std::size_t i = 0; i < count; ++i) out.push_back(full_instance(root, schema.value("items", SchemaJson::object())));
    return out;
  }
  if (type == "string") return std::string(schema.value("minLength", std::size_t{1}), 'x');
  if (type == "integer") return schema.value("minimum", std::int64_t{1});
  if (type == "number") return schema.value("minimum", 1.0);
  if (type == "boolean") return true;
  return nullptr;
}

inline SchemaJson full_instance(const SchemaJson& root) { return full_instance(root, root); }

}  // namespace tally::testing
