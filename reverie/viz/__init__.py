"""Seeing what the world model learned (issue 5): open-loop predictions, reconstructions, reward plots,
imagined trajectories. Works with any agent that exposes a world model as ``agent.wm`` (docs/viz.md).
"""

from reverie.viz.figure import figure_to_array
from reverie.viz.grid import abs_error, video_grid
from reverie.viz.openloop import OpenLoop, find_world_model, open_loop, prediction_errors
from reverie.viz.report import report, sample_for_report
from reverie.viz.reward_plot import reward_plot
from reverie.viz.vector_plot import vector_plot

__all__ = ["OpenLoop", "abs_error", "figure_to_array", "find_world_model", "open_loop", "prediction_errors",
           "report", "reward_plot", "sample_for_report", "vector_plot", "video_grid"]
