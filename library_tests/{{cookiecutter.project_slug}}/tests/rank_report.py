"""A callback for the launch tests: every process prints its own validation accuracy."""

import lightning as L


class PrintValAcc(L.Callback):
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = float(trainer.callback_metrics["val/acc"])
        print(f"rank={trainer.global_rank} val/acc={value:.6f}", flush=True)
