"""Training frameworks under hpctrain's notices and requeue (compute side): Hugging Face Transformers'
`Trainer` (`hf`), PyTorch Lightning (`lightning`). Each module imports its framework; nothing here is
imported by the login-node CLI."""
