#ifndef MUONSHARD_PYTHON_SRC_SESSION_OPTIONS_H_
#define MUONSHARD_PYTHON_SRC_SESSION_OPTIONS_H_

// The one mapping of RankSession's keyword arguments onto the C++ option
// structs (worker::RankSessionOptions, worker::OptimizerConfig, the
// recovery driver's restarts): a table of options, each with its Python name,
// how a value is read, and its default, which is the struct's own. So the
// extension has no defaults of its own, muonshard.torch takes its keyword
// defaults from session_defaults(), and muonshard-worker's flags take theirs
// from the same structs (worker/main.cc): the three cannot drift.

#include <string>

#include "pybind11/pybind11.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/rank_session.h"

namespace muonshard::python {

// What RankSession(**kwargs) runs with.
struct SessionSettings {
  SessionSettings();

  worker::RankSessionOptions options;
  worker::OptimizerConfig config;
  int max_restarts = 0;  // NOTE [Recovery]: worker::RecoveryDriver's budget
};

// The settings of `kwargs`: a None value keeps the default. Raises
// TypeError naming an unknown keyword (nothing a caller passes is ignored)
// and ValueError (INVALID_ARGUMENT) for a bad value. check_view is the
// caller's (it needs the GIL handling of the session) and is skipped here.
// REQUIRES: the GIL.
SessionSettings ParseSessionKwargs(const pybind11::kwargs& kwargs);

// {name: default} of every option ParseSessionKwargs knows (durations in
// seconds, enums by their names).
pybind11::dict SessionDefaults();

}  // namespace muonshard::python

#endif  // MUONSHARD_PYTHON_SRC_SESSION_OPTIONS_H_
