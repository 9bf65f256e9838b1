"""Who calls the sandbox and what each may do: IAM, project metadata, OS Login."""
