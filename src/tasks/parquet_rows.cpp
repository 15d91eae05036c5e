#include "hybridflow/tasks/parquet_rows.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/writer.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"

namespace hybridflow {

namespace {

using Json = nlohmann::ordered_json;

void check_ok(const arrow::Status& status, const std::string& path, const char* doing) {
  HF_CHECK(status.ok(), path, ": ", doing, ": ", status.ToString());
}

template <typename T>
T value_or_fail(arrow::Result<T> result, const std::string& path, const char* doing) {
  check_ok(result.status(), path, doing);
  return std::move(result).ValueUnsafe();
}

// Row i of `array` as JSON, whatever the column's type; `path` only names the file in errors.
Json to_json(const arrow::Array& array, int64_t i, const std::string& path) {
  if (array.IsNull(i)) return nullptr;
  switch (array.type_id()) {
    case arrow::Type::NA: return nullptr;
    case arrow::Type::BOOL: return static_cast<const arrow::BooleanArray&>(array).Value(i);
    case arrow::Type::INT8: return static_cast<const arrow::Int8Array&>(array).Value(i);
    case arrow::Type::INT16: return static_cast<const arrow::Int16Array&>(array).Value(i);
    case arrow::Type::INT32: return static_cast<const arrow::Int32Array&>(array).Value(i);
    case arrow::Type::INT64: return static_cast<const arrow::Int64Array&>(array).Value(i);
    case arrow::Type::UINT8: return static_cast<const arrow::UInt8Array&>(array).Value(i);
    case arrow::Type::UINT16: return static_cast<const arrow::UInt16Array&>(array).Value(i);
    case arrow::Type::UINT32: return static_cast<const arrow::UInt32Array&>(array).Value(i);
    case arrow::Type::UINT64: return static_cast<const arrow::UInt64Array&>(array).Value(i);
    case arrow::Type::FLOAT: return static_cast<const arrow::FloatArray&>(array).Value(i);
    case arrow::Type::DOUBLE: return static_cast<const arrow::DoubleArray&>(array).Value(i);
    case arrow::Type::STRING: return std::string(static_cast<const arrow::StringArray&>(array).GetView(i));
    case arrow::Type::LARGE_STRING: return std::string(static_cast<const arrow::LargeStringArray&>(array).GetView(i));
    case arrow::Type::STRING_VIEW: return std::string(static_cast<const arrow::StringViewArray&>(array).GetView(i));
    case arrow::Type::BINARY: return std::string(static_cast<const arrow::BinaryArray&>(array).GetView(i));
    case arrow::Type::LARGE_BINARY: return std::string(static_cast<const arrow::LargeBinaryArray&>(array).GetView(i));
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(array);
      Json out = Json::object();
      // field(j) is already adjusted for the struct's own offset, so row i indexes it directly.
      for (int j = 0; j < s.num_fields(); ++j) out[s.struct_type()->field(j)->name()] = to_json(*s.field(j), i, path);
      return out;
    }
    case arrow::Type::MAP: {
      const auto& m = static_cast<const arrow::MapArray&>(array);
      const int64_t begin = m.value_offset(i), end = begin + m.value_length(i);
      const bool string_keys = m.keys()->type_id() == arrow::Type::STRING || m.keys()->type_id() == arrow::Type::LARGE_STRING;
      Json out = string_keys ? Json::object() : Json::array();
      for (int64_t k = begin; k < end; ++k) {
        Json key = to_json(*m.keys(), k, path), value = to_json(*m.items(), k, path);
        if (string_keys) out[key.get<std::string>()] = std::move(value);
        else out.push_back(Json::array({std::move(key), std::move(value)}));
      }
      return out;
    }
    case arrow::Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(array);
      return to_json(*d.dictionary(), d.GetValueIndex(i), path);
    }
    case arrow::Type::EXTENSION:
      return to_json(*static_cast<const arrow::ExtensionArray&>(array).storage(), i, path);
    default: break;
  }
  const auto scalar = value_or_fail(array.GetScalar(i), path, "reading a value");
  if (arrow::is_list_like(array.type_id()) || arrow::is_list_view(array.type_id())) {
    // Every list flavour (list, large, fixed-size, view) hands out its row as one array.
    const auto& values = *static_cast<const arrow::BaseListScalar&>(*scalar).value;
    Json out = Json::array();
    for (int64_t k = 0; k < values.length(); ++k) out.push_back(to_json(values, k, path));
    return out;
  }
  return scalar->ToString();  // dates, timestamps, decimals, ...: Arrow's text for them
}

// The type a column must have to hold every row's value, as pandas / pyarrow infer it from Python objects.
struct Shape {
  enum Kind { kNull, kBool, kInt, kDouble, kString, kList, kStruct } kind = kNull;
  std::vector<Shape> element;                             // kList: one
  std::vector<std::pair<std::string, Shape>> fields;      // kStruct, in order of first appearance

  static const char* name(Kind k) {
    static const char* const names[] = {"null", "boolean", "integer", "number", "string", "list", "object"};
    return names[k];
  }
};

Shape::Kind kind_of(const Json& v) {
  if (v.is_null()) return Shape::kNull;
  if (v.is_boolean()) return Shape::kBool;
  if (v.is_number_integer()) return Shape::kInt;
  if (v.is_number()) return Shape::kDouble;
  if (v.is_string()) return Shape::kString;
  if (v.is_array()) return Shape::kList;
  return Shape::kStruct;
}

void widen(Shape* shape, const Json& v, const std::string& column, const std::string& path, size_t row) {
  const Shape::Kind k = kind_of(v);
  if (k == Shape::kNull) return;
  if (shape->kind == Shape::kNull) {
    shape->kind = k;
    if (k == Shape::kList) shape->element.resize(1);
  } else if ((shape->kind == Shape::kInt && k == Shape::kDouble) || (shape->kind == Shape::kDouble && k == Shape::kInt)) {
    shape->kind = Shape::kDouble;
    return;
  }
  HF_CHECK(shape->kind == k, path, ": row ", row, ": '", column, "' is ", Shape::name(k), " but earlier rows have ",
           Shape::name(shape->kind), "; a parquet column holds one type");
  if (k == Shape::kList) {
    for (const auto& e : v) widen(&shape->element[0], e, column + "[]", path, row);
  } else if (k == Shape::kStruct) {
    for (const auto& [key, value] : v.items()) {
      auto it = std::find_if(shape->fields.begin(), shape->fields.end(), [&](const auto& f) { return f.first == key; });
      if (it == shape->fields.end()) it = shape->fields.insert(shape->fields.end(), {key, Shape{}});
      widen(&it->second, value, column + "." + key, path, row);
    }
  }
}

std::shared_ptr<arrow::DataType> arrow_type(const Shape& shape) {
  switch (shape.kind) {
    case Shape::kNull: return arrow::null();
    case Shape::kBool: return arrow::boolean();
    case Shape::kInt: return arrow::int64();
    case Shape::kDouble: return arrow::float64();
    case Shape::kString: return arrow::utf8();
    case Shape::kList: return arrow::list(arrow_type(shape.element[0]));
    case Shape::kStruct: {
      arrow::FieldVector fields;
      for (const auto& [name, s] : shape.fields) fields.push_back(arrow::field(name, arrow_type(s)));
      return arrow::struct_(fields);
    }
  }
  return arrow::null();
}

arrow::Status append(arrow::ArrayBuilder* builder, const Shape& shape, const Json& v) {
  if (v.is_null()) return builder->AppendNull();
  switch (shape.kind) {
    case Shape::kNull: return builder->AppendNull();
    case Shape::kBool: return static_cast<arrow::BooleanBuilder*>(builder)->Append(v.get<bool>());
    case Shape::kInt: return static_cast<arrow::Int64Builder*>(builder)->Append(v.get<int64_t>());
    case Shape::kDouble: return static_cast<arrow::DoubleBuilder*>(builder)->Append(v.get<double>());
    case Shape::kString: return static_cast<arrow::StringBuilder*>(builder)->Append(v.get<std::string>());
    case Shape::kList: {
      auto* list = static_cast<arrow::ListBuilder*>(builder);
      ARROW_RETURN_NOT_OK(list->Append());
      for (const auto& e : v) ARROW_RETURN_NOT_OK(append(list->value_builder(), shape.element[0], e));
      return arrow::Status::OK();
    }
    case Shape::kStruct: {
      auto* st = static_cast<arrow::StructBuilder*>(builder);
      ARROW_RETURN_NOT_OK(st->Append());
      for (size_t j = 0; j < shape.fields.size(); ++j) {
        const auto it = v.find(shape.fields[j].first);
        ARROW_RETURN_NOT_OK(append(st->field_builder(static_cast<int>(j)), shape.fields[j].second,
                                   it == v.end() ? Json(nullptr) : *it));
      }
      return arrow::Status::OK();
    }
  }
  return arrow::Status::OK();
}

}  // namespace

std::vector<nlohmann::ordered_json> read_parquet_rows(const std::string& path) {
  HF_CHECK(file_exists(path), path, ": no such file");
  const auto file = value_or_fail(arrow::io::ReadableFile::Open(path), path, "opening");
  const auto reader = value_or_fail(parquet::arrow::OpenFile(file, arrow::default_memory_pool()), path,
                                    "not a readable parquet file");
  const auto table = value_or_fail(reader->ReadTable(), path, "reading the parquet table");
  std::vector<Json> rows(static_cast<size_t>(table->num_rows()), Json::object());
  for (int c = 0; c < table->num_columns(); ++c) {
    const std::string& name = table->field(c)->name();
    int64_t row = 0;
    for (const auto& chunk : table->column(c)->chunks())
      for (int64_t i = 0; i < chunk->length(); ++i) rows[static_cast<size_t>(row++)][name] = to_json(*chunk, i, path);
  }
  return rows;
}

void write_parquet_rows(const std::string& path, const std::vector<nlohmann::ordered_json>& rows) {
  std::vector<std::pair<std::string, Shape>> columns;
  for (size_t r = 0; r < rows.size(); ++r) {
    HF_CHECK(rows[r].is_object(), path, ": row ", r, ": expected a JSON object, got ", rows[r].type_name());
    for (const auto& [key, value] : rows[r].items()) {
      auto it = std::find_if(columns.begin(), columns.end(), [&](const auto& c) { return c.first == key; });
      if (it == columns.end()) it = columns.insert(columns.end(), {key, Shape{}});
      widen(&it->second, value, key, path, r);
    }
  }
  arrow::FieldVector fields;
  arrow::ArrayVector arrays;
  for (const auto& [name, shape] : columns) {
    const auto type = arrow_type(shape);
    auto builder = value_or_fail(arrow::MakeBuilder(type), path, "making a column builder");
    for (const auto& row : rows) {
      const auto it = row.find(name);
      check_ok(append(builder.get(), shape, it == row.end() ? Json(nullptr) : *it), path, "building a column");
    }
    fields.push_back(arrow::field(name, type));
    arrays.push_back(value_or_fail(builder->Finish(), path, "building a column"));
  }
  const auto table = arrow::Table::Make(arrow::schema(fields), arrays, static_cast<int64_t>(rows.size()));
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    const auto out = value_or_fail(arrow::io::FileOutputStream::Open(tmp), tmp, "opening for writing");
    check_ok(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out), tmp, "writing parquet");
    check_ok(out->Close(), tmp, "closing");
  }
  HF_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, path, ": cannot rename ", tmp, " to it");
}

}  // namespace hybridflow
