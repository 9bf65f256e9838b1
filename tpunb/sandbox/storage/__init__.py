"""Cloud Storage here: gcp-storage-emulator behind Cloud Storage's authentication and IAM."""
