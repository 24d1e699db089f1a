"""Calibration profiles as the daemon reads them: the schema (`profile`), reading and checking a
document (`parse`) and a path watched for changes (`source`).

`gpuscope calibrate` (the `exporter.calibrate` job, which needs PyTorch) writes profiles; this
package only reads and validates them, and never imports PyTorch, so the daemon stays small.
"""
