"""Unit 9, exercise 2: the loop always starts at epoch 0; resume_or_start's epoch is ignored
(the weights are loaded, the epochs run again)."""

NOTEBOOK = "09_capstone.ipynb"
GRADE_ID = "ex2-solution"
BODY = """
start = time.time()
model = train.original_cnn(seed=0).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
resume_or_start(model, opt, ckpt_path)
final_model = ddp = DDP(model)
history = []
for epoch in range(epochs):
    elapsed = torch.tensor([time.time() - start])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if elapsed.item() > budget_s:
        break
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=0,
                                 drop_last=True)
    sampler.set_epoch(epoch)
    ddp.train()
    for xb, yb in DataLoader(train_set, batch_size=32, sampler=sampler):
        opt.zero_grad()
        F.cross_entropy(ddp(xb.to(device)), yb.to(device)).backward()
        opt.step()
    val = train.evaluate(ddp.module, val_x.to(device), val_y.to(device))
    save_checkpoint(ddp, opt, epoch + 1, ckpt_path)
    history.append({"epoch": epoch, "val_accuracy": val["accuracy"],
                    "seconds": time.time() - start})
return history
"""
FAILS = "ex2-test"
MESSAGE = 'start the loop at the epoch resume_or_start returns'
WITHIN_S = 30
