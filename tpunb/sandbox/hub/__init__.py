"""The Hugging Face Hub here: the routes huggingface_hub calls."""
