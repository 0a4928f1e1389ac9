#ifndef MUONSHARD_IMPORTER_SAFETENSORS_FILES_H_
#define MUONSHARD_IMPORTER_SAFETENSORS_FILES_H_

// Reads a safetensors checkpoint's headers from disk and imports them
// (safetensors_import.h). The thin I/O layer: it reads each file's 8-byte
// length and N-byte JSON header through an Env (common/env.h; a test's
// FaultInjectionEnv reaches it), never the tensor data, and leaves every
// decision to the pure importer.

#include <string>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "importer/safetensors_import.h"

namespace muonshard::importer {

// The manifest of the checkpoint at `path`, which is one of:
//   a directory holding model.safetensors (taken first, as transformers
//     does) or model.safetensors.index.json and the shards it names;
//   a safetensors file;
//   an index file (a name ending in ".index.json"), its shards beside it.
// default_name, unless set: the directory's name for a directory or for the
// standard names model.safetensors / model.safetensors.index.json, the file
// name without ".safetensors" / ".safetensors.index.json" otherwise.
//
// NOT_FOUND names a missing input, a directory holding neither standard
// name, and a shard the index names that does not exist. INVALID_ARGUMENT
// for what is there but malformed (ImportSafetensorsHeaders), for what is not
// a regular file, and for an index above kMaxSafetensorsHeaderBytes. Other
// codes for I/O failures (the Env's, naming the file). bytes_read counts the
// index too. Reads through Env::Default().
absl::StatusOr<SafetensorsImport> ImportSafetensors(const std::string& path, SafetensorsImportOptions options);
// The same through `env`.
absl::StatusOr<SafetensorsImport> ImportSafetensors(Env* env, const std::string& path,
                                                    SafetensorsImportOptions options);

}  // namespace muonshard::importer

#endif  // MUONSHARD_IMPORTER_SAFETENSORS_FILES_H_
