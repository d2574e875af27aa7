"""Caption data modules: procedural shapes (default), a folder of images, WebDataset tar shards."""

from numdev.data.datamodule import CaptionDataModule
from numdev.data.folder import FolderDataModule, FolderDataset
from numdev.data.sampler import StepBatchSampler
from numdev.data.shapes import ShapesDataModule, ShapesDataset
from numdev.data.webdataset import ShardStream, WebDataModule

__all__ = [
    "CaptionDataModule",
    "FolderDataModule",
    "FolderDataset",
    "ShapesDataModule",
    "ShapesDataset",
    "ShardStream",
    "StepBatchSampler",
    "WebDataModule",
]
