"""The model: network, objective (what each minibatch kind trains), correction, validation, steppers."""
