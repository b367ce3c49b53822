"""Worker: import torch (and what --preload imports), then exit normally: the output must be empty."""

import torch  # noqa: F401
import torch._dynamo  # noqa: F401
