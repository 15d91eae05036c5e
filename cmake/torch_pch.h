// Precompiled once and shared by every target: the libtorch headers cost ~17 s per file otherwise.
#pragma once
#include <torch/torch.h>
