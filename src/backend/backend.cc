// The backend interface has no out-of-line code yet; this file anchors the
// seam where backend selection (Gloo, NCCL) will live.
#include "src/backend/backend.h"
