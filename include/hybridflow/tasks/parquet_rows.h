// Parquet files as rows of JSON objects, through Apache Arrow's C++ libraries (cmake/arrow.cmake). Only
// the data readers link Arrow; everything else sees JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hybridflow {

// One object per row, column name -> value, converted generically: strings, numbers and booleans as
// themselves, structs and maps (with string keys) as objects, lists as arrays, nulls as null, dictionary
// columns by their values, dates and timestamps as their integer count, decimals as strings, binary
// columns as strings. A file that cannot be read is an error naming it and Arrow's reason.
std::vector<nlohmann::ordered_json> read_parquet_rows(const std::string& path);

// Writes `rows` (JSON objects) as a parquet file, with column types inferred from the values the way
// pandas / pyarrow infer them from Python dicts (objects -> structs, arrays -> lists, integers -> int64).
// Written to a temporary file and renamed, so a reader never sees half a file.
void write_parquet_rows(const std::string& path, const std::vector<nlohmann::ordered_json>& rows);

}  // namespace hybridflow
