#include "tests/testing/status_matchers.h"
