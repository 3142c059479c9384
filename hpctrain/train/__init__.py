"""The reference 3D-parallel (dp x tp x pp) GPT trainer on DeepSpeed (compute nodes only).

ds_config needs neither torch nor deepspeed; the other modules import both.
"""
