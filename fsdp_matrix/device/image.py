"""What the device machine's image holds, and the sites of wheels a run carries to it.

The image is this workplace's CUDA image on the lent single-H200 machine. Its package list and versions were read
from the workplace's machine description (KINDS.md of the device tool, "Python packages already there", as read on a
machine running the image on 2026-11-17, and one session's ``pip list`` of 2026-11). They are the planning inputs;
the run itself prints and records what is installed there, which is what records carry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Optional, Tuple

from packaging.utils import canonicalize_name

PYTHON = "3.12"
"""The image's Python (3.12.3 at /opt/torch/.venv/bin/python3): the wheels are fetched for cp312."""
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17, 12, 5)) + (
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)
"""pip download's --platform values for the image (x86-64, glibc 2.39); pip matches each N exactly."""

_INSTALLED = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax
fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""
INSTALLED: FrozenSet[str] = frozenset(canonicalize_name(n) for n in _INSTALLED.split())
"""Every distribution the image holds (canonical names); a wheel is carried only for a name not in it, or for another
version than the image's."""

VERSIONS: Dict[str, Optional[str]] = {
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "accelerate": "1.15.0",
    "peft": "0.21.1",
    "bitsandbytes": None,
    "trl": None,
}
"""The image's versions of the packages rules name, for planning. peft's is not known (no listing gave it): 0.21.1 is
the release of transformers 5.17.0's time (combo torch2.14 pairs them); the run prints and records the real one."""


@dataclass(frozen=True)
class Site:
    """A ``pip install --target`` folder of wheels, put in front of the image's packages on PYTHONPATH."""

    name: str
    """Folder name under DIR/wheels/ and the site's name in the plan (letters, digits, '-')."""
    wants: Tuple[str, ...]
    """Exact requirements (NAME==VERSION) fetched as wheels; what they need that the image lacks is fetched too."""
    versions: Dict[str, Optional[str]] = field(default_factory=dict)
    """What the rules' packages are with this site in front of the image's (None: not installed)."""
    over: Tuple[str, ...] = ()
    """Sites this one is stacked on (in front of them), e.g. the harness's pydantic."""
    why: str = ""
    """What this site is for, said in the plan and the log."""
    records: str = ""
    """The combo suffix of the records made under it (``gpu-image-<records>``); empty: the image's own combo."""


HARNESS = Site(
    "harness",
    ("pydantic==2.12.5",),
    dict(VERSIONS),
    why="the harness's own requirement the image lacks (pydantic, with pydantic-core and what it needs)",
)
BASE = Site(
    "base",
    ("bitsandbytes==0.50.2", "trl==1.14.1"),
    {**VERSIONS, "bitsandbytes": "0.50.2", "trl": "1.14.1"},
    ("harness",),
    "bitsandbytes' CUDA kernels (libbitsandbytes_cuda130.so) for the QLoRA cells; trl for the TRL cells (trl 1.14.1 "
    "is the release of transformers 5.17.0's time, as on combo torch2.14)",
)
OLD = Site(
    "peft0.13.0",
    (
        "peft==0.13.0",
        "transformers==4.46.3",
        "accelerate==1.1.1",
        "tokenizers==0.20.3",
        "huggingface-hub==0.36.0",
        "datasets==4.4.2",
    ),
    {**BASE.versions, "peft": "0.13.0", "transformers": "4.46.3", "accelerate": "1.1.1"},
    ("base",),
    "peft 0.13.0, the release with seed 002's device mismatch at merge (peft#2129), with the transformers and "
    "accelerate of combo old (4.46.3, 1.1.1: peft 0.13.x's time); transformers 4.46.3 refuses huggingface-hub 1.x at "
    "import, so a 0.x hub comes too, and a datasets that takes it (transformers.trainer imports datasets; base's "
    "5.2.0 fails on hub 0.36, seen here). Over base: every cell imports bitsandbytes (fsdp_matrix/workload/models.py); "
    "base's trl wants a newer transformers, so the TRL cells stay off this site",
    records="peft0.13.0",
)
SITES: Tuple[Site, ...] = (HARNESS, BASE, OLD)
TRIM: Dict[str, Tuple[str, ...]] = {"bitsandbytes": ("libbitsandbytes_cpu.so", "libbitsandbytes_cuda130.so")}
"""Native libraries a wheel keeps when trimmed for the trip: bitsandbytes 0.50.2 ships one per CUDA, ROCm and XPU
release (41.1 MiB); it loads the one of torch's CUDA (13.0 in the image, the CPU one in the rehearsal), so the others
stay behind. ``--prepare --no-trim`` keeps them all (for a machine with another CUDA)."""
"""Every site, in install order. A site's wheels must name one version of each package (two stop pip)."""


def site(name: str) -> Site:
    return next(s for s in SITES if s.name == name)


def stack(name: str) -> Tuple[str, ...]:
    """A site and every site under it, front first: the PYTHONPATH order."""
    out = [name]
    for below in site(name).over:
        out += [s for s in stack(below) if s not in out]
    return tuple(out)
